"""A GGUF file (the form llama.cpp, Ollama and LM Studio keep models in) as a model `finetune` can train.

    header = read_header("model.gguf")        # architecture, dimensions, tensor types: no weight is read
    check_loadable(header)                    # one sentence naming what transformers cannot read, if anything
    folder = converted_folder("model.gguf")   # <cache>/gguf/<sha256>/, converted on first use, reused after

transformers reads GGUF with the `gguf` package and dequantizes it; the conversion does that once and
saves the result as a plain safetensors folder (config.json, model.safetensors, the tokenizer and its chat
template from the file's metadata) with `source.json` naming the original file and its sha256. It is
written to a temporary folder and renamed into place, so a crash leaves nothing that looks complete; the temporary
folder's name carries the process id, and the next conversion removes those whose process is gone (caches.py).
A manifest.json, written last, lists every file's size and sha256: a folder whose files no longer match it
(`conversion_problem`) is converted again from the GGUF file, and a pulled base's is refused (bases.py).

The file's sha256 keys the folder. Hashing costs about 0.3 s per 100 MB; to avoid it on every command a
small note keyed by (path, size, modification time) remembers the hash of a file already hashed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from finetune.models.known_bases import base_for_sha256
from finetune.settings import caches
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import remembered_sha256
from finetune.settings.manifest import ManifestError, files_problem, read_manifest, write_manifest
from finetune.settings.wording import ref

log = logging.getLogger("finetune")
GGUF_SUFFIX = ".gguf"
SOURCE_FILE = "source.json"  # in a converted folder: which GGUF it came from


def is_gguf_path(name: str) -> bool:
    return name.lower().endswith(GGUF_SUFFIX)


def cache_root() -> Path:
    """The one cache root (caches.py): $FINETUNE_CACHE, else $XDG_CACHE_HOME/finetune, else ~/.cache/finetune."""
    return caches.root()


# ----------------------------------------------------------------------------- the header


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file says about itself, read without its weights."""

    path: Path
    architecture: str
    """`general.architecture` as llama.cpp names it (llama, qwen2, gemma3, ...)."""
    metadata: dict[str, Any]
    """Every scalar key (arrays are left out: the vocabulary alone has tens of thousands of entries)."""
    tensor_types: dict[str, int] = field(default_factory=dict)
    """Storage type (F32, Q4_1, ...) -> tensors stored so."""
    total_params: int = 0
    """Sum of the element counts of every tensor."""
    has_output: bool = True
    """An `output.weight` tensor: an output layer of its own (False: tied to the embeddings)."""
    vocab_size: int | None = None
    """Rows of the embedding: `<arch>.vocab_size`, else the length of the token list."""

    def get(self, key: str) -> Any:
        """`<architecture>.<key>` (e.g. "block_count"), None when absent."""
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def chat_template(self) -> str | None:
        template = self.metadata.get("tokenizer.chat_template")
        return template if isinstance(template, str) and template.strip() else None


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def read_header(path: str | Path) -> GGUFHeader:
    """The header of a GGUF file; UserError when it is not one (or the gguf package is missing)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{ref('model', path)}: no such GGUF file")
    return _read_header(*_file_key(path))


@cache  # per process: `plan` reads it for the facts and again for the chat template
def _read_header(resolved: str, size: int, mtime_ns: int) -> GGUFHeader:
    try:
        from gguf import GGUFReader, GGUFValueType
    except ImportError:
        raise UserError("reading a GGUF file needs the `gguf` package: pip install gguf") from None
    path = Path(resolved)
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # ValueError (bad magic, version), struct/numpy errors on a truncated file
        raise UserError(f"{path}: not a readable GGUF file ({exc})") from None
    metadata: dict[str, Any] = {}
    token_count = None
    for key, value in reader.fields.items():
        if value.types and value.types[0] == GGUFValueType.ARRAY:
            if key == "tokenizer.ggml.tokens":
                token_count = len(value.data)
            continue
        try:
            metadata[key] = value.contents()
        except Exception:  # a value the reader cannot decode is not one the plan needs
            continue
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise UserError(f"{path}: the GGUF file names no architecture (general.architecture is missing)")
    vocab = metadata.get(f"{architecture}.vocab_size")
    return GGUFHeader(
        path=path,
        architecture=architecture,
        metadata=metadata,
        tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors)),
        total_params=sum(int(t.n_elements) for t in reader.tensors),
        has_output=any(t.name == "output.weight" for t in reader.tensors),
        vocab_size=int(vocab) if isinstance(vocab, int) else token_count,
    )


# ----------------------------------------------------------------------------- what transformers can read


def _transformers_name(architecture: str) -> str:
    """llama.cpp's architecture name as transformers' GGUF loader renames it (qwen2moe -> qwen2_moe, gpt-oss -> gpt_oss)."""
    return re.sub(r"(\d)moe$", r"\1_moe", architecture.replace("-", "_"))


def readable_architectures() -> set[str]:
    """The `general.architecture` values transformers loads as a causal LM from GGUF (this version of it)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    legacy = {a for a in GGUF_SUPPORTED_ARCHITECTURES if a in CAUSAL or f"{a}_text" in CAUSAL}
    try:  # the newer loader (transformers >= 5.2x) handles a few architectures of its own
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:
        GGUF_ARCHS = {}
    return legacy | set(GGUF_ARCHS)


def dequantizable_types() -> set[str]:
    """Storage types the gguf package turns back into floats."""
    from gguf.quants import _type_traits  # the registry of its dequantizers (F32 and F16 are views)

    return {"F32", "F16"} | {qtype.name for qtype in _type_traits}


def check_loadable(header: GGUFHeader) -> None:
    """One sentence naming the architecture or storage type transformers cannot read; nothing when it can."""
    readable = readable_architectures()
    if header.architecture not in readable and _transformers_name(header.architecture) not in readable:
        raise UserError(
            f"{header.path}: its architecture {header.architecture!r} is not one transformers can load from GGUF as "
            f"a causal language model (it reads: {', '.join(sorted(readable))}); use a model folder (safetensors) instead"
        )
    unknown = sorted(set(header.tensor_types) - dequantizable_types())
    if unknown:
        raise UserError(
            f"{header.path}: some tensors are stored as {', '.join(unknown)}, which the gguf package cannot "
            "dequantize; re-quantize the file to another type (e.g. Q8_0 or F16 with llama.cpp's llama-quantize) "
            "or use a model folder (safetensors)"
        )


# ----------------------------------------------------------------------------- sha256, remembered


def file_sha256(path: str | Path) -> str:
    """sha256 of the file's bytes; remembered in the cache by (path, size, modification time)."""
    return remembered_sha256(path, cache_root() / "gguf" / "hashes")


# ----------------------------------------------------------------------------- the converted folder


def cache_folder(sha256: str) -> Path:
    return cache_root() / "gguf" / sha256


def is_converted(folder: Path) -> bool:
    """A finished conversion: source.json is written last, and the folder only appears by rename."""
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


_LEGACY_TEMP = re.compile(r"^\.[0-9a-f]{16}-[a-z0-9_]{8}$")  # an earlier version's temporary folders (no pid)
_verified: set[tuple] = set()  # folders whose every file matched its checksum in this process, by their files' stat


def conversion_problem(folder: Path, hashes: bool = True) -> str | None:
    """None when the converted folder is whole: every file its manifest lists, with its size (and sha256).
    A folder already hashed in this process is not hashed again while its files' sizes and times stay the same."""
    if not is_converted(folder):
        return "its conversion never finished"
    try:
        expected = read_manifest(folder)
    except ManifestError as exc:
        return f"{exc} (converted by an earlier version of finetune)"
    if problem := files_problem(folder, expected, hashes=False):
        return problem
    if not hashes:
        return None
    key = (str(folder.resolve()), *((name, *_stat(folder / name)) for name in sorted(expected)))
    if key in _verified:
        return None
    if problem := files_problem(folder, expected, hashes=True):
        return problem
    _verified.add(key)
    return None


def _stat(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def converted_folder(path: str | Path, sha256: str | None = None) -> Path:
    """The safetensors folder of a GGUF file, converted now when it is not yet in the cache or no longer matches
    its manifest (the sizes; the sha256 too for a known base's file, whose conversion is small enough to hash)."""
    gguf = Path(path).expanduser()
    if not gguf.is_file():
        raise UserError(f"{ref('model', path)}: no such GGUF file")
    sha256 = sha256 or file_sha256(gguf)
    folder = cache_folder(sha256)
    if is_converted(folder):
        problem = conversion_problem(folder, hashes=base_for_sha256(sha256) is not None)
        if problem is None:
            return folder
        log.warning("%s: the converted folder %s is damaged (%s); converting it again", gguf.name, folder, problem)
        caches.remove_folder(folder)
    header = read_header(gguf)
    check_loadable(header)
    caches.sweep_stale(folder.parent, legacy=_LEGACY_TEMP)
    partial = caches.temp_folder(folder.parent, sha256[:16])
    try:
        log.info("converting %s (sha256 %s) into %s: once, then reused", gguf, sha256[:12], folder)
        _convert(gguf, header, sha256, partial)
        _share_like_other_files(partial)
        write_manifest(partial, fsync=False)  # last: a damaged or truncated file is caught before it is used
        try:
            partial.rename(folder)
        except OSError:  # another process finished the same conversion first: theirs is identical
            if not is_converted(folder):
                shutil.rmtree(folder, ignore_errors=True)  # a leftover that is not a finished conversion
                partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _share_like_other_files(folder: Path) -> None:
    """The permissions the user's umask gives new files (mkdtemp and safetensors make them private)."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~mask)


def _convert(gguf: Path, header: GGUFHeader, sha256: str, out: Path) -> None:
    """Dequantize to float32 (the training dtype) and save model and tokenizer as transformers folders."""
    import gguf as gguf_package
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from transformers.utils.quantization_config import GgufConfig

    hf_logging.disable_progress_bar()
    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    try:
        # dequantize=True: plain float modules (never packed GGUF layers, which can neither train nor be saved)
        model = AutoModelForCausalLM.from_pretrained(
            **where, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
        tokenizer = AutoTokenizer.from_pretrained(**where)
    except (ValueError, NotImplementedError, KeyError, OSError, RuntimeError) as exc:
        raise UserError(
            f"{gguf}: transformers cannot load this GGUF file (architecture {header.architecture!r}): {exc}"
        ) from None
    model.save_pretrained(out)
    # the tokenizer transformers builds from the file's metadata; reloaded from the folder, a family with its own
    # tokenizer class (Qwen2) takes that family's pre-tokenizer, as it would from the original model's folder
    tokenizer.save_pretrained(out)
    source = {
        "gguf_file": str(gguf.resolve()),
        "sha256": sha256,
        "size_bytes": gguf.stat().st_size,
        "architecture": header.architecture,
        "tensor_types": header.tensor_types,
        "dtype": "float32",
        "converted_with": {"transformers": transformers.__version__, "gguf": _version(gguf_package)},
    }
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")  # last: marks the folder complete


def _version(module) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module.__name__)
    except PackageNotFoundError:
        return "unknown"


def read_source(folder: str | Path) -> dict | None:
    """source.json of a converted folder: the GGUF file and its sha256; None for any other folder."""
    try:
        source = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(source, dict) or not isinstance(source.get("sha256"), str):
        return None
    return source
