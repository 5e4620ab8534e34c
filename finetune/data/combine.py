"""Tokenized chunks -> one TokenizedData (the token cache's content) -> PreparedData (what a run trains on).

The chunks of a data (and validation) file, tokenized on every core (parallel.py), are split into training
and validation by whole conversation (split.py's rule, on per-conversation digests), written as flat token
arrays, and read back as the records and the DataSummary a plan is built from.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from finetune.data import invented, sensitive
from finetune.data.arrays import TokenArrays
from finetune.data.fitting import Fit, LongRecords, dropped_lines, in_file_order
from finetune.data.parallel import (
    ChunkResult,
)
from finetune.data.read import DUPLICATE_LINES_SHOWN
from finetune.data.split import auto_val_fraction
from finetune.data.types import DataSummary, TokenizedRecord
from finetune.rules.auto import Choice
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.wording import ref

TRAIN, VAL, LEFT_OUT = 0, 1, -1  # the side of a record: validation-file duplicates of training are left out
_RECORD_ARRAYS = ("starts", "lengths", "num_targets", "conversation", "line", "truncated")


@dataclass
class PreparedData:
    train: Sequence[TokenizedRecord]  # a TokenArrays with a tokenizer; records index it like a list
    val: Sequence[TokenizedRecord]
    summary: DataSummary  # the numbers the plan needs; its advice reads truncation and drops from here
    end_of_turn_id: int | None = None
    cache_entry: str | None = None  # the token cache folder the records come from (None: not cached)
    from_cache: bool = False  # True when nothing was tokenized: the cache held this data already
    skipped: list[dict] = field(default_factory=list)  # --skip-invalid: the lines left out, for OUT/skipped.jsonl


@dataclass
class TokenizedData:
    """What the token cache holds: every kept record of the data (and validation) file, with its side."""

    records: TokenArrays  # file order, the data file's records first
    side: np.ndarray  # [records] TRAIN or VAL
    first_is_target: np.ndarray  # [records] bool: nothing would predict the first target
    learns_end: np.ndarray  # [records] bool: the end-of-turn token is a target
    fit: np.ndarray  # [records] fitting.Fit: kept whole, one of a split conversation's records, or shortened
    meta: dict  # counts of the split, dropped records, end-of-turn id (see _split_and_count)


def val_fraction(config: RunConfig, unique_conversations: int) -> tuple[float, str]:
    if config.val_file:
        return 0.0, f"your validation file {config.val_file}"
    if config.val_fraction == AUTO:
        return auto_val_fraction(unique_conversations)
    if config.val_fraction == 0:
        return 0.0, f"validation off ({ref('val_fraction', 0)})"
    return float(config.val_fraction), f"your {ref('val_fraction')} {config.val_fraction}"


def _digests(results: list[ChunkResult]) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    digests = np.concatenate([r.conv_digest for r in results]) if results else np.zeros((0, 32), np.uint8)
    ranks = np.concatenate([r.conv_rank for r in results]) if results else np.zeros((0, 32), np.uint8)
    messages = np.concatenate([r.conv_messages for r in results]) if results else np.zeros(0, np.int64)
    return [row.tobytes() for row in digests], ranks, messages


def _split_and_count(
    train_results: list[ChunkResult], val_results: list[ChunkResult] | None, config: RunConfig
) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """The side of every conversation (split.py's rule, on digests), and the split's counts for the facts."""
    digests, ranks, messages = _digests(train_results)
    first: dict[bytes, int] = {}
    for i, digest in enumerate(digests):
        first.setdefault(digest, i)
    fraction, _ = val_fraction(config, len(first))
    train_side = np.full(len(digests), TRAIN, dtype=np.int8)
    val_side = None
    duplicates_removed = 0
    if val_results is None:
        if fraction > 0 and len(first) >= 2:  # as split_conversations: rank groups by (seed, conversation)
            n_val = min(len(first) - 1, max(1, round(fraction * len(first))))
            ranked = sorted(first, key=lambda d: ranks[first[d]].tobytes())
            held_out = set(ranked[:n_val])
            train_side[[i for i, d in enumerate(digests) if d in held_out]] = VAL
    else:  # as remove_overlap: validation conversations that are also training ones are left out
        val_digests, _, _ = _digests(val_results)
        val_side = np.array([LEFT_OUT if d in first else VAL for d in val_digests], dtype=np.int8)
        duplicates_removed = int((val_side == LEFT_OUT).sum())
    counts = {
        "unique_conversations": len(first),
        "duplicate_conversations": len(digests) - len(first),
        "train_conversations": int((train_side == TRAIN).sum()),
        "val_conversations": int((train_side == VAL).sum()) if val_side is None else int((val_side == VAL).sum()),
        "train_messages": int(messages[train_side == TRAIN].sum()),
        "duplicates_removed": duplicates_removed,
    }
    return train_side, val_side, counts


def _write_npy(path: Path, results: list[ChunkResult], kind: str, dtype) -> None:
    """One flat .npy of every chunk's ids or weights, copied file by file (never all in memory)."""
    count = sum(r.tokens for r in results)
    with open(path, "wb") as out:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (count,)}
        np.lib.format.write_array_header_1_0(out, header)
        for result in results:
            source = getattr(result, f"{kind}_file")
            if source is not None:
                with open(source, "rb") as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
                Path(source).unlink()
            else:
                np.ascontiguousarray(getattr(result, kind), dtype=dtype).tofile(out)


def combine(
    folder: Path,
    train_results: list[ChunkResult],
    val_results: list[ChunkResult] | None,
    config: RunConfig,
    end_of_turn_id: int,
) -> dict:
    """Write ids.npy, weights.npy and records.npz into `folder`; returns the meta the cache keeps with them."""
    train_side, val_side, meta = _split_and_count(train_results, val_results, config)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in (*_RECORD_ARRAYS, "side", "first", "end", "fit")}
    dropped: list[list] = []
    built_train = 0
    token_base = 0
    for results, sides in ((train_results, train_side), (val_results or [], val_side)):
        conv_base = 0
        for result in results:
            conv = result.rec_conv + conv_base
            side = sides[conv] if len(conv) else np.zeros(0, np.int8)
            starts = token_base + np.concatenate([[0], np.cumsum(result.rec_len)[:-1]]).astype(np.int64)
            keep = side != LEFT_OUT
            for name, values in (
                ("starts", starts),
                ("lengths", result.rec_len),
                ("num_targets", result.rec_targets),
                ("conversation", conv),
                ("line", result.rec_line),
                ("truncated", result.rec_truncated),
                ("side", side),
                ("first", result.rec_first_is_target),
                ("end", result.rec_learns_end),
                ("fit", result.rec_fit),
            ):
                parts[name].append(np.asarray(values)[keep])
            built_train += int((side == TRAIN).sum())
            for local, line, reason, tokens in result.dropped:
                where = int(sides[local + conv_base])
                if where != LEFT_OUT:
                    dropped.append([where, line, reason, tokens])
                    built_train += where == TRAIN
            token_base += result.tokens
            conv_base += result.conversations
    all_results = train_results + (val_results or [])
    _write_npy(folder / "ids.npy", all_results, "ids", np.int32)
    _write_npy(folder / "weights.npy", all_results, "weights", np.float32)
    np.savez(folder / "records.npz", **{name: np.concatenate(values) for name, values in parts.items()})
    dropped.sort(key=lambda row: row[0])  # training side first, file order within each side
    data_format = next((r.format for r in train_results if r.format is not None), None)
    meta["duplicate_lines"] = _first_copies(train_results)  # train and plan warn of duplicates too
    meta.update(train_records_built=built_train, dropped=dropped, end_of_turn_id=end_of_turn_id, skipped=[])
    meta["longest"] = max((int(r.src_len.max()) for r in all_results if len(r.src_len)), default=0)
    meta["data_format"] = data_format
    found = {"data": [f for r in train_results for f in r.sensitive]}
    found |= {"val_file": [f for r in val_results for f in r.sensitive]} if val_results else {}
    meta["sensitive"] = sensitive.of_sides(found, config.sensitive_data)
    meta["invented"] = invented.merge([r.invented for r in train_results])  # the data file's replies only
    sensitive.refuse_if_found(sensitive_found(meta, config))  # before the cache keeps anything of it
    return meta


def _first_copies(results: list[ChunkResult], shown: int = DUPLICATE_LINES_SHOWN) -> list[int]:
    """The file lines of the first `shown` conversations that repeat an earlier one (from their records' lines)."""
    digests, _, _ = _digests(results)
    seen: set[bytes] = set()
    copies = []
    for index, digest in enumerate(digests):
        if digest in seen:
            copies.append(index)
            if len(copies) == shown:
                break
        seen.add(digest)
    lines: dict[int, int] = {}
    base = 0
    for result in results:
        records = zip(result.rec_conv.tolist(), result.rec_line.tolist(), strict=True)
        for local, line in [*records, *((c, n) for c, n, _, _ in result.dropped)]:
            lines.setdefault(local + base, line)
        base += result.conversations
    return [lines[i] for i in copies if i in lines]


def load_tokenized(folder: Path, meta: dict, in_memory: bool) -> TokenizedData:
    mode = None if in_memory else "r"
    with np.load(folder / "records.npz") as stored:
        rec = {name: stored[name] for name in stored.files}
    records = TokenArrays(
        np.load(folder / "ids.npy", mmap_mode=mode),
        np.load(folder / "weights.npy", mmap_mode=mode),
        **{name: rec[name] for name in _RECORD_ARRAYS},
    )
    return TokenizedData(
        records, rec["side"], rec["first"].astype(bool), rec["end"].astype(bool), rec["fit"].astype(np.int8), meta
    )


def _check_masking(data: TokenizedData, side: int, source: str, end_of_turn_id: int) -> None:
    """tokenize.check_masking, on the arrays: every record scores something, and end-of-turn is learned."""
    mine = np.flatnonzero(data.side == side)
    no_targets = data.records.num_targets[mine] == 0
    bad = no_targets | data.first_is_target[mine]
    if bad.any():
        first_bad = int(np.argmax(bad))
        line = int(data.records.line[mine[first_bad]])
        if no_targets[first_bad]:
            raise UserError(f"{source}:{line}: this record has no target tokens after tokenization")
        raise UserError(f"{source}:{line}: the first token is a target, so nothing predicts it")
    if len(mine) and not data.learns_end[mine].any():
        raise UserError(f"{source}: the end-of-turn token is never a target: the model would not learn to stop")


def percentile(ordered: np.ndarray, q: float) -> int:
    if not len(ordered):
        return 0
    return int(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if q > 0 else ordered[0])


def display_name(path: str | None) -> str:
    """How a summary names a file: its name alone, so no folder (a server's, say) shows in a plan or an event."""
    return Path(path).name if path else "training data"


def _long_records(data: TokenizedData, config: RunConfig, max_seq_len: int) -> LongRecords:
    """FILE:LINE of every conversation split, record shortened and record dropped, in file order."""
    names = {TRAIN: display_name(config.data), VAL: display_name(config.val_file or config.data)}
    summary = LongRecords(max_seq_len, str(config.truncation), longest=int(data.meta.get("longest", 0)))
    fitted = np.flatnonzero(data.fit != Fit.WHOLE)
    split_seen: set[tuple[int, int]] = set()
    for row in fitted.tolist():
        side, line = int(data.side[row]), int(data.records.line[row])
        place = f"{names[side]}:{line}"
        if data.fit[row] == Fit.SPLIT:
            summary.split_records += 1
            conversation = (side, int(data.records.conversation[row]))
            if conversation not in split_seen:
                split_seen.add(conversation)
                summary.split_at.append(place)
        else:
            summary.shortened_at.append(place)
    for side, line, _, tokens in data.meta["dropped"]:
        summary.dropped_at.append(f"{names[side]}:{line}")
        summary.dropped_need = max(summary.dropped_need, int(tokens))
    return summary


def sensitive_found(meta: dict, config: RunConfig) -> dict | None:
    """The sensitive values found in the data (sensitive.py), its files named as this run names them."""
    names = {"data": display_name(config.data), "val_file": display_name(config.val_file)}
    return sensitive.named(meta.get("sensitive"), names)  # entries cached before it was recorded have none


def prepared_data(data: TokenizedData, config: RunConfig, limit: Choice[int]) -> PreparedData:
    meta = data.meta
    sensitive.refuse_if_found(sensitive_found(meta, config))
    if not meta["train_records_built"]:
        raise UserError("no training records: no assistant message has a weight above 0")
    long = _long_records(data, config, limit.value)
    if config.strict and (error := long.strict_error(limit.reason or None)):
        raise UserError(error)
    train_rows = np.flatnonzero(data.side == TRAIN)
    train = data.records.subset(train_rows)
    val = data.records.subset(np.flatnonzero(data.side == VAL))
    source = config.data or "training data"
    if not len(train):
        raise UserError(f"{source}: nothing trainable remains: {long.sentence() or 'every record was left out'}")
    eot = meta["end_of_turn_id"]
    _check_masking(data, TRAIN, source, eot)
    _check_masking(data, VAL, config.val_file or source, eot)

    fraction, reason = val_fraction(config, meta["unique_conversations"])
    ordered = np.sort(train.lengths)
    shortened = data.fit[train_rows] == Fit.SHORTENED
    summary = DataSummary(
        examples=len(train),
        validation_examples=len(val),
        conversations=meta["train_conversations"],
        validation_conversations=meta["val_conversations"],
        messages=meta["train_messages"],
        tokens_in_file=train.total_tokens,
        counted_with_tokenizer=True,
        target_tokens=train.total_targets,
        context_tokens=train.total_tokens - train.total_targets,
        skipped_lines=len(meta["skipped"]),
        max_record_tokens=int(ordered[-1]),
        p50_record_tokens=percentile(ordered, 0.5),
        p95_record_tokens=percentile(ordered, 0.95),
        truncated_records=int(shortened.sum()),
        truncated_tokens=int(train.truncated.sum()),
        dropped_records=len(meta["dropped"]),
        dropped_lines=dropped_lines([(side, line) for side, line, _, _ in meta["dropped"]], config.val_file),
        duplicates_removed=meta["duplicates_removed"],
        duplicate_conversations=meta.get("duplicate_conversations", 0),  # cache entries made before count none
        duplicate_lines=tuple(meta.get("duplicate_lines", ())),
        val_fraction=fraction,
        val_fraction_reason=reason,
        data_format=meta.get("data_format"),  # entries cached before it was recorded have none
        sensitive_found=sensitive_found(meta, config),
        invented_specifics=invented.named(meta.get("invented"), display_name(config.data)),
        **limit_fields(limit, long),
    )
    return PreparedData(train, val, summary, eot, skipped=_named_skipped(meta["skipped"], config))


def limit_fields(limit: Choice[int], long: LongRecords) -> dict:
    """DataSummary's fields about the limit and what it did to the records."""
    return {
        "max_seq_len": limit.value,
        "max_seq_len_reason": limit.reason or None,
        "split_at": tuple(in_file_order(long.split_at)),
        "split_records": long.split_records,
        "shortened_at": tuple(in_file_order(long.shortened_at)),
        "dropped_at": tuple(in_file_order(long.dropped_at)),
        "dropped_need_tokens": long.dropped_need,
    }


def stored_skipped(skipped: list[dict], source: str) -> list[dict]:
    """Skipped lines as the cache keeps them: by the setting that named their file ("data" or "val_file"),
    since the entry is keyed by the file's bytes and a renamed file reads the same entry."""
    return [{"source": source, **{k: v for k, v in entry.items() if k != "file"}} for entry in skipped]


def _named_skipped(stored: list[dict], config: RunConfig) -> list[dict]:
    """The skipped lines of the cache entry with the file names of this run, in OUT/skipped.jsonl's shape."""
    return [{"file": getattr(config, e["source"]), **{k: v for k, v in e.items() if k != "source"}} for e in stored]
