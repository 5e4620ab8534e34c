"""A job's inputs published to the bucket (`--storage`), so that its trainer runs on any node that reaches it.

    plan, out = published(options, job_id, plan, kind)   # (s3://…/runs/<job>.plan.json, s3://…/runs/<job>)

What planning wrote into the run folder (the held-out test split, the training copy, the replay mix) goes to the
bucket; the plan the trainer executes names the bucket's copies instead of this machine's paths: the uploads, those
files, and the base model (uploaded once, with its manifest, storage/bucket_copy.py), and no token cache folder (each
node would keep its own, which no DELETE reaches: so none, the tokens are made again by each attempt). The worker's own plan (RUNS/<job>.plan.json on this machine) keeps its paths.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from finetune.bucket.remote import Remote
from finetune.plan.plan import Plan
from finetune.service.options import ServiceOptions
from finetune.service.storage import bucket_copy
from finetune.service.workers import library as core

FILE_SETTINGS = ("data", "val_file", "general_data")


def published(options: ServiceOptions, job_id: str, plan: Plan, kind: str) -> tuple[str, str]:
    """Upload the job's inputs and the plan that names them; (the plan's URI, the run folder's URI)."""
    run = options.runs_dir / job_id
    if run.is_dir():
        bucket_copy.push(options, run)
    # no token cache on the nodes: a service job leaves no copy of a tenant's data there (EPHEMERAL_ENV does the rest)
    moved: dict[str, object] = {"cache_dir": None, "cache": False, "out": None}
    data_dir = options.data_dir.resolve()
    for name in FILE_SETTINGS:
        value = getattr(plan.run, name)
        if value and Path(value).resolve().is_relative_to(data_dir):
            moved[name] = bucket_copy.uri(options, Path(value))
    moved["model"] = bucket_copy.publish_base(options, plan.run.model)
    remote_plan = dataclasses.replace(plan, run=dataclasses.replace(plan.run, **moved))
    plan_uri = bucket_copy.uri(options, options.runs_dir / f"{job_id}.plan.json")
    with tempfile.TemporaryDirectory() as folder:
        written = Path(folder) / "plan.json"
        core.write_plan(remote_plan, written, kind)
        parent, _, name = plan_uri.rpartition("/")
        Remote(parent).put({written: name})
    return plan_uri, bucket_copy.uri(options, run)
