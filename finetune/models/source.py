"""Where a model comes from: a local folder (made absolute), a GGUF file (converted once into a cached
folder), a base pulled with `finetune base pull NAME` (its folder), or a hub id (checked reachable, or cached).

No torch here for folders and hub ids: `finetune plan` and `finetune train` both call it before loading
anything. `local_model` is the part every loader uses (no network): a GGUF file or a pulled base's name
becomes its folder, anything else is left as it is.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from finetune.models.bases import check_converted, pulled_folder
from finetune.models.gguf import converted_folder, is_gguf_path, read_source
from finetune.models.known_bases import base_for_sha256, find_base
from finetune.settings.errors import UserError
from finetune.settings.wording import ref, render

HUB_CONNECT_TIMEOUT_S = 3.0


def resolve_model(name: str) -> str:
    """Where the model comes from, as a name that works from any directory, checked before anything loads.

    A local folder becomes its absolute path (so adapter_config.json's base_model_name_or_path resolves
    from anywhere). A hub id stays an id; when the hub cannot be reached within a few seconds, a cached copy
    is used offline (HF_HUB_OFFLINE), and without one the run stops at once with what to do instead of
    spending about a minute in download retries.
    """
    folder = Path(name).expanduser()
    if folder.is_dir():
        return str(folder.resolve())
    if folder.exists():
        if is_gguf_path(name):
            return str(converted_folder(folder))
        raise UserError(
            f"{ref('model', name)} is a file; pass the folder that holds the model (config.json, *.safetensors) "
            "or a .gguf file"
        )
    if is_gguf_path(name):
        raise UserError(f"{ref('model', name)}: no such GGUF file ({folder.resolve()})")
    if find_base(name) is not None:  # a short name: its pulled folder, never a download here
        return str(pulled_folder(name))
    if _looks_like_a_path(name):  # a hub id is "name" or "owner/name": this one can only be a folder
        raise UserError(f"{ref('model', name)}: no such folder ({folder.resolve()})")
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.is_offline_mode() or _hub_reachable(constants.ENDPOINT):
        return name
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        logging.getLogger("finetune").info("note: the hub is not reachable; using the cached copy of %s", name)
        os.environ["HF_HUB_OFFLINE"] = "1"
        constants.HF_HUB_OFFLINE = True
        return name
    raise UserError(
        f"cannot reach the Hugging Face hub ({constants.ENDPOINT}) to download the model {name!r}, and no copy "
        f"is cached. Pass a local model folder as {ref('model')}, or download it where there is network and run with "
        "HF_HUB_OFFLINE=1."
    )


def local_model(name: str) -> str:
    """The folder to load for `name` when it is a GGUF file (converted on first use) or a pulled base's short
    name; any other name (a folder, a hub id) unchanged, a converted GGUF folder checked against its manifest.
    No network: what every model and tokenizer loader calls."""
    if is_gguf_path(name) and Path(name).expanduser().is_file():
        return str(converted_folder(name))
    if Path(name).expanduser().is_dir() and read_source(Path(name).expanduser()) is not None:
        check_converted(Path(name).expanduser(), name)  # what is used is checked, not only what was downloaded
        return name
    if not Path(name).expanduser().exists() and find_base(name) is not None:
        return str(pulled_folder(name))
    return name


def origin(model: str | None) -> dict | None:
    """Where a resolved model folder came from when it is a converted GGUF: {"gguf_file", "sha256"} (and the
    known base it is, with its package and licence); None for any other model. The card and plan.json name it."""
    if not model:
        return None
    source = read_source(model)
    if source is None:
        return None
    found = {"gguf_file": source.get("gguf_file"), "sha256": source["sha256"]}
    base = base_for_sha256(source["sha256"])
    if base is not None:
        found |= {"base": base.name, "package": base.requirement, "licence": base.licence}
    return found


def model_name(model: str | None) -> str:
    """A model as a person names it (the loss curve's title): a pulled base by its short name, a converted GGUF
    by its file's name, a local folder by the folder's name, a hub id as it is; never a cache path."""
    if not model:
        return "model"
    found = origin(model)
    if found is not None:
        return found.get("base") or Path(str(found.get("gguf_file") or model)).name
    path = Path(model).expanduser()
    return path.resolve().name if path.exists() else model


def _looks_like_a_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..") or name.count("/") > 1 or "\\" in name


def _hub_reachable(endpoint: str) -> bool:
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=HUB_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def load_failure(subject: str, exc: Exception) -> UserError:
    """One sentence for a model or tokenizer transformers would not load (`subject`: "the model 'NAME'"). A model that ships its own Python code
    is refused by default, and transformers then asks for `trust_remote_code=True`, a Python argument: the
    command line's way to say it is --trust-remote-code."""
    if "trust_remote_code" in str(exc):
        return needs_remote_code(subject)
    return UserError(f"cannot load {subject}: {exc}")


def needs_remote_code(subject: str) -> UserError:
    return UserError(
        f"cannot load {subject}: it needs Python code from the model's own folder or repository, "
        f"which finetune runs only with {ref('trust_remote_code')} (read that code first: it runs with your rights)"
    )


_SAID: set[str] = set()  # the models this process has warned about (once each, whichever loader asks first)


def check_remote_code(model: str | None, trust_remote_code: bool) -> None:
    """What every command says, the same way and once, about a model whose config.json asks for its own Python
    code (`auto_map`), read before anything loads (issue 35). Without `trust_remote_code`: a model_type
    transformers does not know is refused (`needs_remote_code`, as loading it would be); a known one loads with
    transformers' built-in class, and one warning line says the model's own code is ignored."""
    if trust_remote_code or not model or is_gguf_path(model):  # a GGUF carries no Python code
        return
    config = _config_of(model)
    if not config.get("auto_map"):
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # only for such a model: heavy

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise needs_remote_code(f"the model {model!r}")
    if model in _SAID or not _main_process():
        return
    _SAID.add(model)
    logging.getLogger("finetune").warning(
        render(
            f"warning: the config.json of {model} asks for its own Python code (auto_map), which is ignored "
            f"without {ref('trust_remote_code')}: transformers' built-in {model_type} class is used"
        )
    )


def _config_of(model: str) -> dict:
    """config.json of a folder, a pulled base, or a hub id already in the local cache; {} where there is none."""
    folder = Path(model).expanduser()
    folder = folder if folder.is_dir() else Path(local_model(model))  # a pulled base's name: its folder
    path = folder / "config.json"
    if not folder.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a hub id: nothing to read here, the loaders say what is wrong
            return {}
        if not isinstance(cached, str):
            return {}
        path = Path(cached)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # unreadable: the loaders and the planner say so
    return config if isinstance(config, dict) else {}


def _main_process() -> bool:
    """Not a tokenizing worker (multiprocessing) and not a rank after the first: they repeat the main's words."""
    import multiprocessing

    return multiprocessing.parent_process() is None and os.environ.get("RANK", "0") == "0"
