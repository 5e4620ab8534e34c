"""The job service: an OpenAI-compatible fine-tuning API (`finetune serve`) and its workers (`finetune worker`).

settings.py  where the service keeps things (data folder, database URL, registered models)
db.py        the tables and the versioned schema step (SQLite WAL or PostgreSQL)
store.py     the one data-access layer: every query, tenant-scoped, and the workers' claim/lease
keys.py      API keys: made, hashed, checked in constant time
auth.py      the FastAPI dependency that yields the caller's tenant
core.py      every call into the training library (validate, plan, RunConfig, the train command)
objects.py   rows -> the OpenAI JSON objects
app.py       create_app(settings): the FastAPI app, routers in routes/
worker.py    claim a job, run `finetune train` as a child process, turn its run folder into events
"""
