"""From a RunConfig to tokenized, split records: the whole data path in one call.

    prepared = prepare_data(config)          # reads config.data (and config.val_file), validates,
    prepared.train, prepared.val             # splits by conversation, builds records, tokenizes
    prepared.summary                         # DataSummary: the numbers the plan needs (no torch)

With a tokenizer the file is read and tokenized in chunks on every core (parallel.py), the records are
kept in compact arrays (arrays.py), and the result is stored in the token cache (cache.py): the next
plan, train, resume, rank or service job on the same file and settings reads it instead of tokenizing.

Without a tokenizer (no --model, e.g. `finetune plan DATA.jsonl`), token numbers are estimated
from the text and `summary.counted_with_tokenizer` is False.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from finetune.config import AUTO, RunConfig
from finetune.data import cache
from finetune.data.arrays import TokenArrays
from finetune.data.parallel import (
    ChunkResult,
    TokenizeSettings,
    default_workers,
    file_digest,
    scan_file,
    tokenize_chunks,
    tokenize_conversations,
)
from finetune.data.records import build_records
from finetune.data.split import auto_val_fraction, remove_overlap, split_conversations
from finetune.data.stats import estimate_record_tokens
from finetune.data.tokenize import ChatTokenizer, load_tokenizer
from finetune.data.types import Conversation, DataSummary, Record, TokenizedRecord
from finetune.errors import RecordError, UserError

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
    meta: dict  # counts of the split, dropped records, end-of-turn id (see _split_and_count)


# ----------------------------------------------------------------------------- reading (no tokenizer needed)


def read_conversations(
    path: str, format: str | None = None, skip_invalid: bool = False
) -> tuple[list[Conversation], list[dict]]:
    """Read and validate a file; any error stops here with every problem listed, unless skip_invalid
    (then the invalid lines are returned, for OUT/skipped.jsonl)."""
    conversations, skipped, _ = read_conversations_and_format(path, format, skip_invalid)
    return conversations, skipped


def read_conversations_and_format(
    path: str, format: str | None = None, skip_invalid: bool = False
) -> tuple[list[Conversation], list[dict], str | None]:
    """`read_conversations`, and the file's data format (detected, or the one forced)."""
    from finetune.data.read import read_file
    from finetune.data.skipped import usable_conversations

    parsed = read_file(path, format)
    conversations, skipped = usable_conversations(parsed, skip_invalid)
    return conversations, skipped, parsed.format


def _chunkable(path: str) -> bool:
    """Plain JSONL is read in byte chunks on every core; gzip and Parquet are decoded whole first."""
    return not path.lower().endswith((".gz", ".parquet"))


def _records(conversations: list[Conversation], policy: str) -> list[Record]:
    return [r for i, c in enumerate(conversations) for r in build_records(c, i, policy)]


def _val_fraction(config: RunConfig, unique_conversations: int) -> tuple[float, str]:
    if config.val_file:
        return 0.0, f"your validation file {config.val_file}"
    if config.val_fraction == AUTO:
        return auto_val_fraction(unique_conversations)
    if config.val_fraction == 0:
        return 0.0, "validation off (--val-fraction 0)"
    return float(config.val_fraction), f"your --val-fraction {config.val_fraction}"


def _settings(config: RunConfig) -> TokenizeSettings:
    return TokenizeSettings(
        config.max_seq_len, str(config.truncation), str(config.record_policy), config.seed, config.format
    )


# ----------------------------------------------------------------------------- the split, on per-conversation arrays


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
    fraction, _ = _val_fraction(config, len(first))
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
        "train_conversations": int((train_side == TRAIN).sum()),
        "val_conversations": int((train_side == VAL).sum()) if val_side is None else int((val_side == VAL).sum()),
        "train_messages": int(messages[train_side == TRAIN].sum()),
        "duplicates_removed": duplicates_removed,
    }
    return train_side, val_side, counts


# ----------------------------------------------------------------------------- chunk results -> one TokenizedData


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


def _combine(
    folder: Path,
    train_results: list[ChunkResult],
    val_results: list[ChunkResult] | None,
    config: RunConfig,
    end_of_turn_id: int,
) -> dict:
    """Write ids.npy, weights.npy and records.npz into `folder`; returns the meta the cache keeps with them."""
    train_side, val_side, meta = _split_and_count(train_results, val_results, config)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in (*_RECORD_ARRAYS, "side", "first", "end")}
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
            ):
                parts[name].append(np.asarray(values)[keep])
            built_train += int((side == TRAIN).sum())
            for local, line, reason, cut in result.dropped:
                where = int(sides[local + conv_base])
                if where != LEFT_OUT:
                    dropped.append([where, line, reason, cut])
                    built_train += where == TRAIN
            token_base += result.tokens
            conv_base += result.conversations
    all_results = train_results + (val_results or [])
    _write_npy(folder / "ids.npy", all_results, "ids", np.int32)
    _write_npy(folder / "weights.npy", all_results, "weights", np.float32)
    np.savez(folder / "records.npz", **{name: np.concatenate(values) for name, values in parts.items()})
    dropped.sort(key=lambda row: row[0])  # training side first, file order within each side
    data_format = next((r.format for r in train_results if r.format is not None), None)
    meta.update(train_records_built=built_train, dropped=dropped, end_of_turn_id=end_of_turn_id, skipped=[])
    meta["data_format"] = data_format
    return meta


def _load(folder: Path, meta: dict, in_memory: bool) -> TokenizedData:
    mode = None if in_memory else "r"
    with np.load(folder / "records.npz") as stored:
        rec = {name: stored[name] for name in stored.files}
    records = TokenArrays(
        np.load(folder / "ids.npy", mmap_mode=mode),
        np.load(folder / "weights.npy", mmap_mode=mode),
        **{name: rec[name] for name in _RECORD_ARRAYS},
    )
    return TokenizedData(records, rec["side"], rec["first"].astype(bool), rec["end"].astype(bool), meta)


# ----------------------------------------------------------------------------- TokenizedData -> PreparedData


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


def _percentile(ordered: np.ndarray, q: float) -> int:
    if not len(ordered):
        return 0
    return int(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if q > 0 else ordered[0])


def _prepared(data: TokenizedData, config: RunConfig) -> PreparedData:
    meta = data.meta
    if not meta["train_records_built"]:
        raise UserError("no training records: no assistant message has a weight above 0")
    train = data.records.subset(np.flatnonzero(data.side == TRAIN))
    val = data.records.subset(np.flatnonzero(data.side == VAL))
    source = config.data or "training data"
    if not len(train):
        raise UserError(f"{source}: every record is longer than --max-seq-len {config.max_seq_len}")
    eot = meta["end_of_turn_id"]
    _check_masking(data, TRAIN, source, eot)
    _check_masking(data, VAL, config.val_file or source, eot)

    fraction, reason = _val_fraction(config, meta["unique_conversations"])
    ordered = np.sort(train.lengths)
    truncated = train.truncated[train.truncated > 0]
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
        p50_record_tokens=_percentile(ordered, 0.5),
        p95_record_tokens=_percentile(ordered, 0.95),
        truncated_records=len(truncated),
        truncated_tokens=int(truncated.sum()),
        dropped_records=len(meta["dropped"]),
        dropped_lines=tuple(line for _, line, _, _ in meta["dropped"]),
        duplicates_removed=meta["duplicates_removed"],
        val_fraction=fraction,
        val_fraction_reason=reason,
        data_format=meta.get("data_format"),  # entries cached before it was recorded have none
    )
    return PreparedData(train, val, summary, eot, skipped=_named_skipped(meta["skipped"], config))


def _stored_skipped(skipped: list[dict], source: str) -> list[dict]:
    """Skipped lines as the cache keeps them: by the setting that named their file ("data" or "val_file"),
    since the entry is keyed by the file's bytes and a renamed file reads the same entry."""
    return [{"source": source, **{k: v for k, v in entry.items() if k != "file"}} for entry in skipped]


def _named_skipped(stored: list[dict], config: RunConfig) -> list[dict]:
    """The skipped lines of the cache entry with the file names of this run, in OUT/skipped.jsonl's shape."""
    return [{"file": getattr(config, e["source"]), **{k: v for k, v in e.items() if k != "source"}} for e in stored]


# ----------------------------------------------------------------------------- the entry points


def prepare_conversations(
    train_conversations: list[Conversation],
    val_conversations: list[Conversation] | None,
    config: RunConfig,
    tokenizer=None,
) -> PreparedData:
    """Split (unless a validation set is given), build records, tokenize, check the masks; in this process."""
    if tokenizer is None:
        return _estimate(train_conversations, val_conversations, config)
    chat = ChatTokenizer(tokenizer)
    train = [tokenize_conversations(train_conversations, chat, _settings(config))]
    val = None if val_conversations is None else [tokenize_conversations(val_conversations, chat, _settings(config))]
    folder = Path(tempfile.mkdtemp(prefix="finetune-tokens-"))
    try:
        meta = _combine(folder, train, val, config, chat.end_of_turn_id)
        return _prepared(_load(folder, meta, in_memory=True), config)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _tokenize_file(
    path: str, chunks, chat: ChatTokenizer, config: RunConfig, folder: Path, workers: int
) -> tuple[list[ChunkResult], list[dict]]:
    """The chunks of one file tokenized, and the lines --skip-invalid left out. A file with any problem
    (or that is not plain JSONL) is read whole the classic way, which names every problem with its line.
    A record the tokenizer cannot take (RecordError) is reported as FILE:LINE."""
    try:
        return _tokenize_file_in_chunks(path, chunks, chat, config, folder, workers)
    except RecordError as exc:
        raise UserError(f"{path}:{exc.line}: {exc.reason}") from None


def _tokenize_file_in_chunks(
    path: str, chunks, chat: ChatTokenizer, config: RunConfig, folder: Path, workers: int
) -> tuple[list[ChunkResult], list[dict]]:
    if chunks is not None:
        results = tokenize_chunks(
            chunks, chat, _settings(config), str(folder), workers, config.model, config.trust_remote_code
        )
        formats = {r.format for r in results if r.format is not None}
        if all(r.ok for r in results) and len(formats) <= 1 and any(r.conversations for r in results):
            return results, []
        for result in results:  # the token files of the chunks that were fine: not needed after all
            for name in (result.ids_file, result.weights_file):
                if name is not None:
                    Path(name).unlink(missing_ok=True)
    conversations, skipped, data_format = read_conversations_and_format(path, config.format, config.skip_invalid)
    result = tokenize_conversations(conversations, chat, _settings(config))
    result.format = data_format
    return [result], skipped


def _scan(path: str) -> tuple[str, list | None]:
    """sha256 of the file's bytes, and its chunks (None: not chunkable, it is read whole)."""
    try:
        if _chunkable(path):
            return scan_file(path)
        return file_digest(path), None
    except OSError:
        read_conversations(path)  # raises read.py's message for a missing or unreadable file
        raise


def prepare_data(config: RunConfig, tokenizer=None, workers: int | None = None) -> PreparedData:
    """Read, validate, split, build records and tokenize (or read all that from the token cache).

    Raises UserError for unusable input. `workers`: processes that tokenize (default: every core).
    """
    if not config.data:
        raise UserError("no training file given")
    if tokenizer is None and config.model:
        tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template)
    if tokenizer is None:
        train, skipped, data_format = read_conversations_and_format(config.data, config.format, config.skip_invalid)
        val = None
        if config.val_file:
            val, val_skipped = read_conversations(config.val_file, config.format, config.skip_invalid)
            skipped += val_skipped
        prepared = _estimate(train, val, config)
        prepared.skipped = skipped
        prepared.summary = replace(prepared.summary, skipped_lines=len(skipped), data_format=data_format)
        return prepared

    data_digest, chunks = _scan(config.data)
    val_digest, val_chunks = _scan(config.val_file) if config.val_file else (None, None)
    key = cache.cache_key(config, tokenizer, data_digest, val_digest) if config.cache else None
    root = cache.cache_root(config)
    if key is not None and (hit := cache.load_entry(root, key)):
        folder, meta = hit
        prepared = _prepared(_load(folder, meta, in_memory=False), config)
        prepared.cache_entry, prepared.from_cache = str(folder), True
        return prepared

    chat = ChatTokenizer(tokenizer)
    tmp = cache.new_tmp_dir(root) if key is not None else None
    folder = tmp or Path(tempfile.mkdtemp(prefix="finetune-tokens-"))
    workers = workers or default_workers()
    try:
        train, skipped = _tokenize_file(config.data, chunks, chat, config, folder, workers)
        skipped = _stored_skipped(skipped, "data")
        val = None
        if config.val_file:
            val, val_skipped = _tokenize_file(config.val_file, val_chunks, chat, config, folder, workers)
            skipped += _stored_skipped(val_skipped, "val_file")
        meta = _combine(folder, train, val, config, chat.end_of_turn_id)
        meta["skipped"] = skipped
        stored = cache.store_entry(root, key, folder, meta) if tmp is not None else None
        if stored is not None:
            meta = json.loads((stored / "meta.json").read_text(encoding="utf-8"))["meta"]
            prepared = _prepared(_load(stored, meta, in_memory=False), config)
            prepared.cache_entry = str(stored)
            return prepared
        return _prepared(_load(folder, meta, in_memory=True), config)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # gone already when it became the cache entry


# ----------------------------------------------------------------------------- without a tokenizer: estimates


def _estimate(
    train_conversations: list[Conversation], val_conversations: list[Conversation] | None, config: RunConfig
) -> PreparedData:
    """Token counts from text length alone, for planning without a tokenizer."""
    unique = len({c.key() for c in train_conversations})
    fraction, reason = _val_fraction(config, unique)
    if val_conversations is None:
        split = split_conversations(train_conversations, fraction, config.seed)
    else:
        split = remove_overlap(train_conversations, val_conversations)
    train_records = _records(split.train, config.record_policy)
    val_records = _records(split.val, config.record_policy)
    if not train_records:
        raise UserError("no training records: no assistant message has a weight above 0")
    lengths, targets = [], 0
    for record in train_records:
        estimate = estimate_record_tokens(record, max_seq_len=0)
        lengths.append(estimate.total)
        targets += estimate.target
    ordered = np.sort(np.array(lengths, dtype=np.int64))
    summary = DataSummary(
        examples=len(train_records),
        validation_examples=len(val_records),
        conversations=len(split.train),
        validation_conversations=len(split.val),
        messages=sum(len(c.messages) for c in split.train),
        tokens_in_file=int(ordered.sum()),
        counted_with_tokenizer=False,
        target_tokens=targets,
        context_tokens=int(ordered.sum()) - targets,
        max_record_tokens=int(ordered[-1]) or None,
        p50_record_tokens=_percentile(ordered, 0.5),
        p95_record_tokens=_percentile(ordered, 0.95),
        duplicates_removed=split.duplicates_removed,
        val_fraction=fraction,
        val_fraction_reason=reason,
    )
    return PreparedData([], [], summary, None)
