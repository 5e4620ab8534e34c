"""GGUF export: one `.gguf` file for llama.cpp, Ollama and LM Studio, written with the `gguf` package.

    check_gguf_supported(weights)                       before any weights load: one sentence if it cannot be done
    write_gguf(folder, target, "f16", name, base)       a transformers folder (merged or full) -> target .gguf
    gguf_of_run(run, step, target, "f16")               the same from a run folder (the service's download)

The file is converted from the exported folder's safetensors one tensor at a time (memory: one tensor, not
the model), written under a temporary name beside the target and renamed when complete. Families and the
tokenizer: gguf_arch.py and gguf_vocab.py; what is supported and how to add more: docs/gguf.md.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from finetune.settings.errors import UserError
from finetune.ship.export.gguf_arch import (
    Family,
    family_of,
    is_rotary_projection,
    rotary_permuted,
    write_hyperparameters,
)
from finetune.ship.export.gguf_vocab import add_tokenizer, check_tokenizer
from finetune.ship.run_folder import RunWeights, locate_weights, model_file, read_json, resolve_base

GGUF_TYPES = ("f16", "bf16", "f32", "q8_0")
DEFAULT_GGUF_TYPE = "f16"


def _types(gguf_type: str):
    """(tensor type of the matrices, llama.cpp file type) for a --gguf-type."""
    import gguf

    q, f = gguf.GGMLQuantizationType, gguf.LlamaFileType
    return {
        "f32": (q.F32, f.ALL_F32),
        "f16": (q.F16, f.MOSTLY_F16),
        "bf16": (q.BF16, f.MOSTLY_BF16),
        "q8_0": (q.Q8_0, f.MOSTLY_Q8_0),
    }[gguf_type]


def _where(weights: RunWeights) -> str:
    return f"{weights.run} (base {weights.base})" if weights.is_lora else str(weights.run)


def _check(model: str, tokenizer: str, where: str) -> None:
    config_file = model_file(model, "config.json")
    family_of(read_json(config_file) if config_file else {}, where)
    tokenizer_file = model_file(tokenizer, "tokenizer.json")
    check_tokenizer(read_json(tokenizer_file) if tokenizer_file else None, where)


def check_gguf_supported(weights: RunWeights) -> None:
    """Architecture (config.json) and tokenizer (tokenizer.json) of a run's model, read before any weights load."""
    _check(weights.base if weights.is_lora else str(weights.model), weights.tokenizer, _where(weights))


def gguf_problem(run: Path) -> str | None:
    """Why a run's model cannot be written as GGUF, in one sentence; None when it can (the dashboard's offer).

    Judged on the run's base (fine-tuning changes neither architecture nor tokenizer), named without its path.
    """
    name = read_json(Path(run) / "plan.json").get("model")
    if not name:
        return "the run does not say which base model it was trained from (no plan.json)"
    try:
        base = resolve_base(str(name), Path(run))
        _check(base, base, f"the base model {display_base(base)}")
    except UserError as exc:
        return str(exc)
    return None


def display_base(base: str) -> str:
    """The base as general.base_model names it: a hub id as it is, a local folder by its name (no server paths)."""
    return Path(base).name if Path(base).is_dir() else base


# ------------------------------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class PlannedTensor:
    hf_name: str
    file: Path
    gguf_name: str
    shape: tuple[int, ...]
    qtype: object  # gguf.GGMLQuantizationType


def _plan_tensors(folder: Path, config: dict, family: Family, matrices) -> list[PlannedTensor]:
    """Every tensor of the folder with its GGUF name and type, from the safetensors headers alone."""
    import gguf
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder} holds no *.safetensors: nothing to convert to GGUF")
    planned = []
    for file in files:
        with safe_open(file, framework="pt") as handle:
            names = handle.keys()  # a safetensors handle is not iterable
            for hf_name in names:
                shape = tuple(handle.get_slice(hf_name).get_shape())
                gguf_name = family.tensor_name(hf_name, config["num_hidden_layers"])
                if gguf_name is None:
                    raise UserError(
                        f"GGUF export does not support {folder}: its tensor {hf_name} has no {family.name} GGUF name "
                        "(a variant of the architecture this export does not know yet; docs/gguf.md)"
                    )
                qtype = matrices
                if len(shape) <= 1 or gguf_name.endswith("_norm.weight"):
                    qtype = gguf.GGMLQuantizationType.F32  # norms and biases stay f32, as llama.cpp expects
                elif qtype == gguf.GGMLQuantizationType.Q8_0 and shape[-1] % 32:
                    # rows that are not a whole number of q8_0 blocks stay f16 (llama.cpp's converter does so too)
                    qtype = gguf.GGMLQuantizationType.F16
                planned.append(PlannedTensor(hf_name, file, gguf_name, shape, qtype))
    return planned


def _converted(tensor, planned: PlannedTensor, config: dict, family: Family):
    """The bytes of one tensor as the file stores it: permuted where llama.cpp needs it, then cast or quantized."""
    import gguf

    tensor = tensor.float()
    which = is_rotary_projection(planned.hf_name) if family.rotary_permute else None
    if which:
        tensor = rotary_permuted(tensor, config, which)
    return gguf.quants.quantize(tensor.numpy(), planned.qtype)


def _byte_shape(planned: PlannedTensor) -> tuple[tuple[int, ...], object]:
    import gguf
    import numpy as np

    q = gguf.GGMLQuantizationType
    if planned.qtype == q.F32:
        return planned.shape, np.dtype(np.float32)
    if planned.qtype == q.F16:
        return planned.shape, np.dtype(np.float16)
    return gguf.quant_shape_to_byte_shape(planned.shape, planned.qtype), np.dtype(np.uint8)


# ------------------------------------------------------------------------------------------------- the file


def write_gguf(
    folder: Path,
    target: Path,
    gguf_type: str = DEFAULT_GGUF_TYPE,
    name: str | None = None,
    base: str | None = None,
) -> Path:
    """Convert a transformers folder (config.json, safetensors, tokenizer) to one GGUF file at `target`."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    if gguf_type not in GGUF_TYPES:
        raise UserError(f"--gguf-type must be one of {', '.join(GGUF_TYPES)}, got {gguf_type!r}")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    family = family_of(config, str(folder))
    matrices, file_type = _types(gguf_type)

    writer = gguf.GGUFWriter(None, family.arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or folder.resolve().name)
    if base:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, display_base(base))
    write_hyperparameters(writer, config, family)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    generation = read_json(folder / "generation_config.json")
    stop = generation.get("eos_token_id")
    add_tokenizer(writer, folder, config["vocab_size"], stop[0] if isinstance(stop, list) else stop)

    planned = _plan_tensors(folder, config, family, matrices)
    for tensor in planned:
        shape, dtype = _byte_shape(tensor)
        writer.add_tensor_info(tensor.gguf_name, shape, dtype, int(np.prod(shape)) * dtype.itemsize, tensor.qtype)

    handle, partial_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(handle)
    partial = Path(partial_name)
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for file in dict.fromkeys(t.file for t in planned):
            with safe_open(file, framework="pt") as source:
                for tensor in (t for t in planned if t.file == file):
                    writer.write_tensor_data(_converted(source.get_tensor(tensor.hf_name), tensor, config, family))
        writer.close()
        os.replace(partial, target)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return target


def gguf_of_run(run: Path, step: int | None, target: Path, gguf_type: str = DEFAULT_GGUF_TYPE) -> Path:
    """A run's final weights (or one checkpoint's) as a GGUF file: merged into a temporary folder, then converted."""
    from finetune.ship.export.write import saved_dtype, write_model  # torch: the dashboard imports this module

    weights = locate_weights(run, step)
    check_gguf_supported(weights)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=target.parent) as tmp:
        folder = Path(tmp) / "model"
        write_model(weights, folder, saved_dtype(weights.base if weights.is_lora else str(weights.model)))
        return write_gguf(folder, target, gguf_type, name=Path(run).resolve().name, base=weights.base)
