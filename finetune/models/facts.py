"""The numbers of a model that the plan needs (parameters, width, depth), read from its files without torch.

    facts = load_model_facts("path/to/model")        # a local folder (config.json + *.safetensors)
    facts = load_model_facts("path/to/config.json")  # a config file alone
    facts = load_model_facts("Qwen/Qwen2.5-0.5B")    # a hub id: only from the built-in table, never the network
    facts = load_model_facts("model.gguf")           # a GGUF file: its header, without converting it
    facts = load_model_facts("smollm2-135m-instruct") # a pulled base (finetune base pull): its folder

For a local folder the parameter count comes from the safetensors headers (exact, a few KB read);
without weight files it is computed from config.json for Llama/Mistral/Qwen2/Qwen3-like layouts.
For a GGUF file it is the sum of the element counts of its tensors, and the dimensions are its metadata
(`<arch>.embedding_length`, `.block_count`, ...); the output layer is tied when there is no `output.weight`.
Hub ids that are not local come from a small table of published configs, labelled as such.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path

from finetune.models.bases import pulled_folder
from finetune.models.gguf import check_loadable, read_header
from finetune.models.known_bases import find_base
from finetune.rules.model_facts import ModelFacts, from_config, positive_whole
from finetune.settings.errors import UserError

# ----------------------------------------------------------------------------- safetensors headers


# Bytes per element of the dtypes safetensors defines; sub-byte ones (F4, F6) are left unchecked.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit: a larger length is a damaged or hostile file


def _header_params(path: Path) -> int:
    """Sum of the element counts of every tensor in one safetensors file, from its JSON header alone.

    The header is checked as strictly as the loader `train` uses checks it (shapes, dtypes, offsets that
    tile the file exactly), so `plan` never calls a model fine that `train` then cannot load.
    """

    def bad(problem: str) -> UserError:
        return UserError(f"{path}: not a usable safetensors file: {problem}")

    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise bad("it is too short to hold a header")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise bad(f"its header length ({length} bytes) is larger than the file or the 100 MB limit")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise bad("its header is not readable JSON") from None
    if not isinstance(header, dict):
        raise bad(f"its header is {_a_json_type(header)}, not an object of tensors")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("its __metadata__ must be an object of text values")
    total, spans = 0, []
    for name, meta in header.items():
        if not isinstance(meta, dict):
            raise bad(f"the entry of tensor {name!r} is {_a_json_type(meta)}, not an object")
        shape, dtype, offsets = meta.get("shape"), meta.get("dtype"), meta.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):  # fmt: skip
            raise bad(f"tensor {name!r} has the shape {shape!r}; a shape is a list of whole numbers")
        if not isinstance(dtype, str):
            raise bad(f"tensor {name!r} has no dtype")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):  # fmt: skip
            raise bad(f"tensor {name!r} has the data offsets {offsets!r}; they must be [begin, end]")
        count = math.prod(shape)
        if dtype in DTYPE_BYTES and count * DTYPE_BYTES[dtype] != offsets[1] - offsets[0]:
            raise bad(f"tensor {name!r} ({dtype}, shape {shape}) does not fit its {offsets[1] - offsets[0]} bytes")
        total += count
        spans.append((offsets[0], offsets[1]))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise bad("its tensors overlap or leave a gap")
        position = end
    if 8 + length + position != size:
        missing = 8 + length + position - size
        problem = f"{missing} bytes are missing (truncated)" if missing > 0 else "it has bytes past its last tensor"
        raise bad(problem)
    return total


def _a_json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return _index_shards(index)
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("adapter"))


def _index_shards(index: Path) -> list[Path]:
    """The shard files a model.safetensors.index.json names; each must be a file next to it."""
    try:
        loaded = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{index}: the index of the weight files is not readable JSON ({exc})") from None
    weight_map = loaded.get("weight_map") if isinstance(loaded, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index}: the index has no weight_map object naming the weight files")
    shards = set()
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise UserError(f"{index}: the weight_map entry of {tensor!r} is {shard!r}, not a file name")
        shards.add(shard)
    files = sorted(index.parent / shard for shard in shards)
    for file in files:
        if not file.is_file():
            raise UserError(f"{index}: names the weight file {file.name}, which is not in {index.parent}")
    return files


def _from_local(name: str, path: Path) -> ModelFacts:
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise UserError(f"{path}: no config.json, so this is not a model folder")
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{config_path}: cannot read the model config: {exc}") from None
    facts = from_config(cfg, name, f"config.json in {config_path.parent}")
    files = _weight_files(path) if path.is_dir() else []
    if files:
        counted = sum(_header_params(f) for f in files)
        return replace(facts, total_params=counted, exact=True, source=f"safetensors headers in {path}")
    return facts


# ----------------------------------------------------------------------------- built-in table

# Published configs (config.json on the Hugging Face hub) of a few popular models: used only for hub ids
# that are not on this machine; the plan labels them "built-in table". Totals are checked in the tests
# against the published parameter counts.
_LLAMA_8B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)  # fmt: skip
_LLAMA_1B = dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)  # fmt: skip
_LLAMA_3B = dict(model_type="llama", hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                 num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)  # fmt: skip
_QWEN_05B = dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)  # fmt: skip
_QWEN_15B = dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True)  # fmt: skip
_QWEN_7B = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)  # fmt: skip
_MISTRAL_7B = dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False)  # fmt: skip

BUILTIN_CONFIGS: dict[str, dict] = {
    "meta-llama/Llama-3.1-8B": _LLAMA_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA_8B,
    "meta-llama/Llama-3.2-1B": _LLAMA_1B,
    "meta-llama/Llama-3.2-1B-Instruct": _LLAMA_1B,
    "meta-llama/Llama-3.2-3B": _LLAMA_3B,
    "meta-llama/Llama-3.2-3B-Instruct": _LLAMA_3B,
    "Qwen/Qwen2.5-0.5B": _QWEN_05B,
    "Qwen/Qwen2.5-0.5B-Instruct": _QWEN_05B,
    "Qwen/Qwen2.5-1.5B": _QWEN_15B,
    "Qwen/Qwen2.5-1.5B-Instruct": _QWEN_15B,
    "Qwen/Qwen2.5-7B": _QWEN_7B,
    "Qwen/Qwen2.5-7B-Instruct": _QWEN_7B,
    "mistralai/Mistral-7B-v0.1": _MISTRAL_7B,
    "mistralai/Mistral-7B-Instruct-v0.2": _MISTRAL_7B,
    "mistralai/Mistral-7B-v0.3": {**_MISTRAL_7B, "vocab_size": 32768},
    "mistralai/Mistral-7B-Instruct-v0.3": {**_MISTRAL_7B, "vocab_size": 32768},
}
_BUILTIN_BY_LOWER = {key.lower(): key for key in BUILTIN_CONFIGS}


# ----------------------------------------------------------------------------- GGUF header


def from_gguf(name: str, path: Path) -> ModelFacts:
    """ModelFacts from a GGUF file's header (no weight is read, nothing is converted)."""
    header = read_header(path)
    check_loadable(header)  # the plan of a file train cannot load stops here, with the reason
    source = f"GGUF header of {path}"

    def number(key: str, default: int | None = None) -> int:
        value = header.get(key)
        if isinstance(value, list):  # per-layer values (e.g. LFM2's kv heads): the widest layer
            value = max(value, default=0)
        if not isinstance(value, int) or isinstance(value, bool):
            if default is not None:
                return default
            raise UserError(f"{source}: no {header.architecture}.{key}, so this planner cannot size the model")
        return value

    hidden, heads = number("embedding_length"), number("attention.head_count")
    facts = ModelFacts(
        name=name,
        source=source,
        model_type=header.architecture,
        total_params=header.total_params,
        exact=True,
        hidden_size=hidden,
        num_layers=number("block_count"),
        num_heads=heads,
        num_kv_heads=number("attention.head_count_kv", heads),
        head_dim=number("attention.key_length", hidden // heads),
        intermediate_size=number("feed_forward_length"),
        vocab_size=header.vocab_size or 0,
        tie_word_embeddings=not header.has_output,
        attention_bias=header.architecture == "qwen2",
        context_length=positive_whole(header.get("context_length")),
    )
    if not facts.vocab_size:
        raise UserError(f"{source}: no vocabulary size and no token list, so this planner cannot size the model")
    return facts


def load_model_facts(model: str | None) -> ModelFacts | None:
    """Facts of `model` (local folder, config.json path, GGUF file, pulled base, or a hub id in the built-in
    table); None when unknown.

    Raises UserError for a local path that exists but cannot be read as a model, and for a known base that
    is not pulled yet.
    """
    if not model:
        return None
    path = Path(model).expanduser()
    if path.is_file() and path.name.lower().endswith(".gguf"):
        return from_gguf(model, path)
    if path.exists():
        return _from_local(model, path)
    if find_base(model) is not None:
        return _from_local(model, pulled_folder(model))
    key = _BUILTIN_BY_LOWER.get(model.lower())
    if key is None:
        return None
    return from_config(
        BUILTIN_CONFIGS[key], model, f"built-in table of published configs ({key}), not read from the model"
    )
