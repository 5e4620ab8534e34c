"""The fingerprint of a run: what defines it, recorded in every checkpoint so --resume cannot silently
train something else.

    now = run_fingerprint(plan)                          # a dict of plain values, stored in state.json
    changes = check_resume(saved, now, allowed="lr")     # UserError naming every change not allowed

Which settings define a run is declared with each setting (config.py: `resume="allow"` or `"refuse"`): the
training and validation data (by the sha256 of their bytes), the model (its path or hub id, and a hash of its
config.json and weight files), the method, LoRA rank, alpha and output layer, the learning rate,
schedule and warmup, DPO's beta and SFT weight, the seed; plus one number the plan derives, the effective
batch (the records of every step depend on it; the device count alone may change). `--allow-changes lr,data`
continues anyway for the settings a checkpoint can carry over; the changes are returned so the report records
them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from finetune.settings import caches
from finetune.settings.errors import UserError
from finetune.settings.registry import in_a_sentence, settings
from finetune.settings.wording import ref

SOURCE_FILE = ".finetune-source"  # written by bucket/inputs.py into a folder it downloaded: the folder's URI
EFFECTIVE_BATCH = "effective_batch"  # the one derived number in the fingerprint
# what checkpoints of earlier versions recorded under other names (None: another shape, not compared)
OLD_NAMES: dict[str, str | None] = {"val_data": None, "objective": None, "schedule": None}


@dataclass(frozen=True)
class Identity:
    """One entry of the fingerprint: how a change of it is named, and whether a checkpoint can carry it over."""

    label: str
    allowable: bool
    why_not: str = ""


def identities() -> dict[str, Identity]:
    """Fingerprint key -> what it is, from the settings' declarations."""
    found = {
        s.name: Identity(_noun(s.label), s.about.resume == "allow", s.about.why_not)
        for s in settings()
        if s.about.resume is not None
    }
    found[EFFECTIVE_BATCH] = Identity("the effective batch", False, "the records of every step depend on it")
    return found


def _noun(label: str) -> str:
    return "the " + in_a_sentence(label)


@dataclass(frozen=True)
class Change:
    key: str
    before: object
    now: object

    def describe(self) -> str:
        identity = identities()[self.key]
        text = f"{identity.label} changed ({_show(self.before)} then, {_show(self.now)} now)"
        return text if identity.allowable else f"{text}, which a checkpoint cannot carry over: {identity.why_not}"

    def to_dict(self) -> dict:
        return {"setting": self.key, "before": self.before, "now": self.now}

    def accepted(self, checkpoint: str) -> str:
        """The line a resume prints for a change --allow-changes let through (it is also in report.json)."""
        return (
            f"{ref('resume')}: continuing from {checkpoint} with {self.describe()}, "
            f"as {ref('allow_changes')} {self.key} allows"
        )


def file_sha256(path: str | Path) -> str:
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def remembered_sha256(path: str | Path, notes: Path | None = None) -> str:
    """sha256 of the file's bytes, remembered in `notes` (default: <cache root>/hashes) by the file's resolved path,
    size and modification time: a large file is read once (about 0.3 s per 100 MB), then only stat'ed."""
    stat, resolved = Path(path).stat(), Path(path).resolve()
    name = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    note = (notes or caches.root() / "hashes") / name
    try:
        known = note.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", known):
            return known
    except OSError:
        pass
    digest = file_sha256(resolved)
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        tmp = note.with_name(f".{note.name}.{os.getpid()}")
        tmp.write_text(digest + "\n")
        os.replace(tmp, note)
    except OSError:  # a read-only cache only costs the hash next time
        pass
    return digest


def model_identity(model: str) -> dict:
    """A local folder: its absolute path and a hash of config.json and of the weight files' bytes (each file's sha256,
    remembered by path, size and modification time: `remembered_sha256`); a hub id: the id."""
    path = Path(model).expanduser()
    if not path.exists():
        return {"name": model}
    folder = path if path.is_dir() else path.parent
    digest = hashlib.sha256()
    if (folder / "config.json").is_file():
        digest.update((folder / "config.json").read_bytes())
    for weights in sorted(folder.glob("*.safetensors")):
        if not weights.name.startswith("adapter"):
            digest.update(weights.name.encode() + b"\0" + remembered_sha256(weights).encode())
    source = folder / SOURCE_FILE  # a node-local copy of a bucket's folder is named by its URI, on any node
    name = source.read_text(encoding="utf-8").strip() if source.is_file() else str(path.resolve())
    return {"name": name, "sha256": digest.hexdigest()}


def _value(plan, name: str):
    """A fingerprint entry's plain value: files and the model by identity, settings as resolved by the plan."""
    run = plan.run
    if name == "data":
        return {"file": Path(run.data).name, "sha256": plan.data.data_sha256 or file_sha256(run.data)}
    if name == "val_file":
        if not run.val_file:
            return None
        return {"file": Path(run.val_file).name, "sha256": plan.data.val_sha256 or file_sha256(run.val_file)}
    if name == "val_fraction":
        return plan.data.val_fraction or 0.0
    if name == "model":
        return model_identity(run.model)
    spec = next(s for s in settings() if s.name == name)
    return getattr(run, name) if spec.applies(run.objective, run.trained_weights) else None


def run_fingerprint(plan) -> dict:
    """What defines a run, from its Plan (Auto's choices resolved): plain JSON values."""
    values = {name: _value(plan, name) for name in identities() if name != EFFECTIVE_BATCH}
    return json.loads(json.dumps({**values, EFFECTIVE_BATCH: plan.effective_batch}, default=str))


def parse_allowed(names: str | Iterable[str] | None) -> list[str]:
    """`lr,data` (or a list) as fingerprint keys; UserError for a name it does not know."""
    if not names:
        return []
    items = names.split(",") if isinstance(names, str) else list(names)
    keys = [str(item).strip().replace("-", "_") for item in items if str(item).strip()]
    keys = ["val_file" if key == "val_data" else key for key in keys]  # the spelling of earlier versions
    known = identities()
    unknown = [key for key in keys if key not in known]
    if unknown:
        accepted = ", ".join(key for key, identity in known.items() if identity.allowable)
        raise UserError(f"{ref('allow_changes')}: unknown setting {', '.join(unknown)}; it accepts {accepted}")
    return keys


def diff(saved: dict, now: dict) -> list[Change]:
    """Every entry recorded in both whose value differs (an entry the checkpoint never recorded is skipped)."""
    if any("-" in key for key in saved):  # written by an earlier version: compare what kept its shape
        saved = {k.replace("-", "_"): v for k, v in saved.items() if OLD_NAMES.get(k.replace("-", "_"), k)}
    return [
        Change(key, saved[key], now[key])
        for key in identities()
        if key in saved and key in now and _canonical(saved[key]) != _canonical(now[key])
    ]


def check_resume(saved: dict, now: dict, allowed: str | Iterable[str] | None, checkpoint: str) -> list[Change]:
    """The changes --allow-changes covers; UserError naming every change it does not cover."""
    allowed_keys = parse_allowed(allowed)
    changes = diff(saved, now)
    known = identities()
    refused = [c for c in changes if c.key not in allowed_keys or not known[c.key].allowable]
    if not refused:
        return changes
    what = "; ".join(c.describe() for c in refused)
    fixable = [c.key for c in refused if known[c.key].allowable]
    hint = f", or pass {ref('allow_changes')} {','.join(fixable)} to continue with the new value" if fixable else ""
    raise UserError(
        f"{ref('resume')}: this run is not the one in {checkpoint}: {what}. "
        f"Resume with the same settings, start a new {ref('out')}{hint}"
    )


def _canonical(value: object) -> str:
    if isinstance(value, dict) and "sha256" in value:
        value = {k: v for k, v in value.items() if k != "file"}  # a renamed data file with the same bytes is the same
    return json.dumps(value, sort_keys=True)


def _show(value: object) -> str:
    if isinstance(value, dict):
        if "sha256" in value:
            where = value.get("file") or value.get("name")
            return f"{where}, content {value['sha256'][:12]}"
        if "name" in value:
            return str(value["name"])
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
