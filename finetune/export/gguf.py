"""GGUF export (llama.cpp, Ollama): said plainly when it cannot be done here.

The converter that knows each architecture's tensor layout is llama.cpp's `convert_hf_to_gguf.py`.
It is not published on PyPI: the `gguf` package there is llama.cpp's file reader/writer only, with no
Hugging Face converter, and `llama-cpp-python` compiles llama.cpp from source to install.
"""

from __future__ import annotations

from pathlib import Path

from finetune.errors import UserError

NOT_AVAILABLE = (
    "--gguf: no GGUF converter installs from PyPI (the `gguf` package only reads and writes GGUF files; the "
    "Hugging Face converter is llama.cpp's convert_hf_to_gguf.py, which is not published there). Export without "
    "--gguf, then convert the folder with llama.cpp: python convert_hf_to_gguf.py OUT --outfile model.gguf"
)


def check_gguf_supported(base: str) -> None:
    raise UserError(NOT_AVAILABLE)


def write_gguf(folder: Path, target: Path) -> None:
    raise UserError(NOT_AVAILABLE)
