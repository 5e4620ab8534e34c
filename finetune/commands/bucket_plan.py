"""`finetune train … --launcher ray --out s3://bucket/run`: the run planned here, once, and its inputs put in the
bucket, so that ranks on nodes which share no folder with this machine (nor with each other) can execute it.

    plan_uri = plan_into_bucket(config, launcher)    # s3://bucket/run/launch-plan.json

The data files go to OUT/inputs/<sha256>-<name>, a base model's folder to OUT/inputs/model-<name>-<hash> (with its
manifest, once), what planning writes into OUT (the held-out test split, the replay mix) to OUT itself; the plan
names those URIs, and no token cache folder (each node keeps its own). Each rank downloads what it needs
(bucket/inputs.py) and writes nothing but through the bucket (train/remote_run.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from finetune.bucket.inputs import local_inputs, publish_folder
from finetune.bucket.remote import Remote
from finetune.bucket.uri import is_remote, join, slug
from finetune.models.source import resolve_model
from finetune.run import RUN_FILES, plan_run
from finetune.settings.config import RunConfig
from finetune.settings.fingerprint import file_sha256, model_identity
from finetune.train.remote_run import RemoteRun
from finetune.train.trainer_run import Launcher

PLAN_FILE = "launch-plan.json"
FILE_SETTINGS = ("data", "val_file", "general_data")


def plan_into_bucket(config: RunConfig, launcher: Launcher) -> str:
    """Plan here into this machine's copy of OUT, publish the inputs, write the plan to the bucket; its URI."""
    out = config.out.rstrip("/")
    copy = RemoteRun(out)
    local = copy.open(config.resume, RUN_FILES)  # the node can write there; no run overwritten without --resume
    given = {name: getattr(config, name) for name in FILE_SETTINGS if getattr(config, name)}
    in_bucket = {name: value for name, value in given.items() if is_remote(value)}  # planned on this node's copy
    absolute = {name: str(Path(value).resolve()) for name, value in given.items() if name not in in_bucket}
    planning = dataclasses.replace(config, out=str(local), **absolute, **local_inputs(in_bucket))
    if planning.gpu is None:
        planning = dataclasses.replace(planning, gpu=launcher.device_kind())
    plan = plan_run(planning, local).plan
    copy.remote.put({p: p.relative_to(local).as_posix() for p in sorted(local.rglob("*")) if p.is_file()})
    moved: dict[str, object] = {"out": None, "cache_dir": None, "model": _published_model(plan.run.model, out)}
    for name in FILE_SETTINGS:
        value = getattr(plan.run, name)
        if value:
            moved[name] = in_bucket.get(name) if value == getattr(planning, name) and name in in_bucket else None
            moved[name] = moved[name] or _published_file(Path(value), local, out)
    document = dataclasses.replace(plan, run=dataclasses.replace(plan.run, **moved)).to_dict()
    copy.remote.write_bytes(PLAN_FILE, json.dumps(document, indent=2).encode())
    return join(out, PLAN_FILE)


def _published_file(path: Path, local: Path, out: str) -> str:
    if path.resolve().is_relative_to(local.resolve()):  # written by planning into OUT: uploaded there just now
        return join(out, path.resolve().relative_to(local.resolve()).as_posix())
    name = f"{file_sha256(path)[:16]}-{path.name}"
    inputs = Remote(join(out, "inputs"))
    if inputs.object_size(name) is None:
        inputs.put({path: name})
    return join(out, "inputs", name)


def _published_model(model: str, out: str) -> str:
    folder = Path(resolve_model(model))
    if not folder.is_dir():
        return model  # a hub id: each node reads it from its own hub cache
    identity = model_identity(str(folder))
    return publish_folder(folder, join(out, "inputs", "model-" + slug(f"{folder.name}:{identity.get('sha256')}")))
