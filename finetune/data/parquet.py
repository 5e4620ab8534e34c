"""A Parquet table with the columns of a JSONL format, read as that JSONL: one row, one line.

pyarrow is an optional extra (`pip install 'finetune[parquet]'`). Parquet has no "absent": a row
without a field holds null, so nulls inside a row are dropped before the row is checked, exactly as
if the JSONL line had left the key out.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.settings.errors import UserError


def parquet_as_jsonl(path: Path) -> bytes:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow: pip install 'finetune[parquet]'") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError and others for a damaged file
        raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
    out = bytearray()
    for batch in table.to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            out += json.dumps(_without_nulls(row), default=str).encode("ascii")
            out += b"\n"
    return bytes(out)


def _without_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
