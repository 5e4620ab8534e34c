"""The job service: an OpenAI-compatible fine-tuning API (`finetune serve`) and its workers (`finetune worker`).

Its folders are its layers, bottom to top; a module imports only from its own layer or those below:

    options.py, logs.py   how one service runs (ServiceOptions: data folder, database, models, prices), its log lines
    api_error.py          APIError: a request refused, as the API answers it (any layer may raise it)
    storage/   the database (db.py: tables, schema steps; store.py: every query, tenant-scoped, and the workers'
               claim/lease), API keys, quotas, usage, the audit trail, run folders as read, deletion
    workers/   a worker: claim a job, validate and plan it (library.py: every call into the training library),
               run `finetune train` on it, turn its run folder into events; its presence, the API's pool of them
    api/       the FastAPI app (app.py: create_api), its routes (routes/), auth, the OpenAI objects and errors
    dashboard/ the web dashboard, and create_app: the API with the dashboard, what `finetune serve` serves
    cli/       the command line: the parsers (parser.py) and one module per command (serve, worker, keys, ...)
"""
