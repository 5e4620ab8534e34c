"""The web dashboard at `/`: static pages (vanilla JavaScript modules, no build step, uPlot vendored under
static/vendor/) that call the public /v1 API, plus the dashboard's own /v1/dashboard routes (routes.py).

    app.py      create_app(options): what `finetune serve` serves, the API with the dashboard mounted
    curve.py    the run folder read for charts and the jobs list (down-sampled, cached per folder)
    preview.py  an uploaded file's validation problems, counts, histogram, records and split
    routes.py   the /v1/dashboard routes and `mount_dashboard(app)`
"""
