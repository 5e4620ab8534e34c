"""Where a model comes from: a local folder (made absolute) or a hub id (checked reachable, or cached).

No torch here: `finetune plan` and `finetune train` both call it before loading anything.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from finetune.errors import UserError

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
        raise UserError(f"--model {name} is a file; pass the folder that holds the model (config.json, *.safetensors)")
    if _looks_like_a_path(name):  # a hub id is "name" or "owner/name": this one can only be a folder
        raise UserError(f"--model {name}: no such folder ({folder.resolve()})")
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
        "is cached. Pass a local model folder as --model, or download it where there is network and run with "
        "HF_HUB_OFFLINE=1."
    )


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
        return UserError(
            f"cannot load {subject}: it needs Python code from the model's own folder or repository, "
            "which finetune runs only with --trust-remote-code (read that code first: it runs with your rights)"
        )
    return UserError(f"cannot load {subject}: {exc}")
