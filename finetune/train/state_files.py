"""Nested training state (an optimizer's state_dict, RNG states) as two plain files, never a pickle:

    write_state(folder, "optimizer", optimizer.state_dict())   # optimizer.safetensors + optimizer.json
    state = read_state_files(folder, "optimizer")              # the same nested dict, tensors bit for bit

Every tensor goes to NAME.safetensors under a generated key; the structure around them (dicts with int or str
keys, lists, tuples, numbers, strings, None) goes to NAME.json, with each tensor replaced by {"tensor": key}.
Reading parses JSON and safetensors only, so a forged file can be malformed but can never run code: any problem
is a StateFileError with one sentence (checkpoint.py treats the checkpoint as damaged).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

FORMAT = 1


class StateFileError(ValueError):
    """A state file is missing, malformed or does not match its tensors (what is wrong, in a few words)."""


def state_file_names(name: str) -> tuple[str, str]:
    return f"{name}.safetensors", f"{name}.json"


def write_state(folder: Path, name: str, state: Any) -> None:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(state, tensors)
    tensors_name, json_name = state_file_names(name)
    save_file(_plain(tensors), folder / tensors_name)
    (folder / json_name).write_text(json.dumps({"format": FORMAT, "state": skeleton}))


def _plain(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors that share no memory (what safetensors stores); copies only where needed."""
    plain, storages = {}, set()
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in storages:
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        plain[key] = tensor
    return plain


def read_state_files(folder: Path, name: str) -> Any:
    tensors_name, _ = state_file_names(name)
    try:
        tensors = load_file(folder / tensors_name)
    except (OSError, SafetensorError, ValueError, RuntimeError) as exc:
        raise StateFileError(f"{tensors_name} is not a readable safetensors file ({type(exc).__name__})") from None
    return _skeleton_over(folder, name, tensors)


def check_state_files(folder: Path, name: str) -> None:
    """Raise StateFileError unless the pair would read back: the JSON's structure, and every tensor it names
    in the safetensors header (which is parsed and checked; the tensors' bytes are not loaded)."""
    tensors_name, _ = state_file_names(name)
    try:
        with safe_open(folder / tensors_name, framework="pt") as handle:
            names = dict.fromkeys(handle.keys())
    except (OSError, SafetensorError, ValueError, RuntimeError) as exc:
        raise StateFileError(f"{tensors_name} is not a readable safetensors file ({type(exc).__name__})") from None
    _skeleton_over(folder, name, names)


def _skeleton_over(folder: Path, name: str, tensors: dict) -> Any:
    tensors_name, json_name = state_file_names(name)
    try:
        document = json.loads((folder / json_name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StateFileError(f"{json_name} is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or "state" not in document:
        raise StateFileError(f"{json_name} is not a state file of format {FORMAT}")
    try:
        return _decode(document["state"], tensors)
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise StateFileError(f"{json_name} does not describe {tensors_name} ({type(exc).__name__})") from None


# ----------------------------------------------------------------------------- the JSON skeleton


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value
        return {"tensor": key}
    if isinstance(value, dict):  # keys keep their type: an optimizer's state is keyed by int (or by name)
        return {"dict": [[_key(k), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return {"list": [_encode(v, tensors) for v in value]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}  # nan, inf, -inf: JSON has no spelling of its own for them
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a state file")


def _key(key: Any) -> Any:
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise TypeError(f"cannot store a {type(key).__name__} key in a state file")
    return key


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError("not a state value")
    ((kind, inner),) = value.items()
    if kind == "tensor":
        return tensors[inner]
    if kind == "float":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[inner])
    if kind == "tuple":
        return tuple(_decode(v, tensors) for v in inner)
    if kind == "list":
        return [_decode(v, tensors) for v in inner]
    if kind == "dict":
        return {_key(k): _decode(v, tensors) for k, v in inner}
    raise ValueError(f"unknown kind {kind!r}")
