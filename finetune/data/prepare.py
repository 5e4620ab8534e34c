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
import shutil
import tempfile
from collections.abc import Callable, Collection
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from finetune.data import cache, invented, sensitive
from finetune.data.combine import (
    PreparedData,
    combine,
    display_name,
    load_tokenized,
    prepared_data,
    sensitive_found,
    stored_skipped,
)
from finetune.data.estimate import estimate
from finetune.data.parallel import (
    ChunkResult,
    TokenizeSettings,
    default_workers,
    file_digest,
    read_chunk_conversations,
    refit,
    scan_file,
    tokenize_chunks,
    tokenize_conversations,
)
from finetune.data.read import read_file
from finetune.data.redaction import skipped_as_kept
from finetune.data.seq_len import choose_max_seq_len
from finetune.data.skipped import usable_conversations
from finetune.data.tokenize import ChatTokenizer, load_tokenizer
from finetune.data.types import Conversation
from finetune.rules.auto import Choice
from finetune.rules.model_facts import ModelFacts
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import RecordError, UserError

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
    parsed = read_file(path, format)
    conversations, skipped = usable_conversations(parsed, skip_invalid)
    return conversations, skipped, parsed.format


def _chunkable(path: str) -> bool:
    """Plain JSONL is read in byte chunks on every core; gzip and Parquet are decoded whole first."""
    return not path.lower().endswith((".gz", ".parquet"))


def _settings(config: RunConfig, max_seq_len: int | None) -> TokenizeSettings:
    """What decides the tokens; `max_seq_len` None: records are kept whole, to be fitted once it is chosen."""
    return TokenizeSettings(
        max_seq_len,
        str(config.truncation),
        str(config.record_policy),
        config.seed,
        config.format,
        config.sensitive_data,
    )


# ----------------------------------------------------------------------------- the entry points


def prepare_conversations(
    train_conversations: list[Conversation],
    val_conversations: list[Conversation] | None,
    config: RunConfig,
    tokenizer=None,
) -> PreparedData:
    """Split (unless a validation set is given), build records, tokenize, check the masks; in this process."""
    if tokenizer is None:
        return estimate(train_conversations, val_conversations, config)
    chat = ChatTokenizer(tokenizer)
    given = None if config.max_seq_len == AUTO else choose_max_seq_len(config, np.zeros(0))
    settings = _settings(config, given.value if given else None)
    sides = [train_conversations] + ([] if val_conversations is None else [val_conversations])
    results = [tokenize_conversations(conversations, chat, settings) for conversations in sides]
    limit = given or _fit_results(results, [lambda c=c: c for c in sides], chat, config)
    folder = Path(tempfile.mkdtemp(prefix="finetune-tokens-"))
    try:
        meta = combine(folder, results[:1], results[1:] or None, config, chat.end_of_turn_id)
        return prepared_data(load_tokenized(folder, meta, in_memory=True), config, limit)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _whole_lengths(results: list[ChunkResult]) -> np.ndarray:
    """Every built record's whole length in tokens (the data file's, then the validation file's)."""
    return np.concatenate([r.src_len for r in results]) if results else np.zeros(0, np.int64)


def _fit_results(
    results: list[ChunkResult],
    sources: list[Callable[[], list[Conversation]]],
    chat,
    config: RunConfig,
    facts: ModelFacts | None = None,
) -> Choice[int]:
    """Choose Auto's limit from results tokenized whole, then fit them to it: only the chunks holding a record
    over the limit are read again (`sources[i]()` gives chunk i's conversations), and only those records are
    tokenized again, in parts."""
    limit = choose_max_seq_len(config, _whole_lengths(results), facts=facts)
    settings = _settings(config, limit.value)
    for result, source in zip(results, sources, strict=True):
        if (result.rec_len > limit.value).any():
            refit(result, source(), chat, settings)
    return limit


Tokenized = tuple[list[ChunkResult], list[dict], list[Callable[[], list[Conversation]]]]


def _tokenize_file(
    path: str, chunks, chat: ChatTokenizer, config: RunConfig, limit: int | None, folder: Path, workers: int
) -> Tokenized:
    """The chunks of one file tokenized, the lines --skip-invalid left out, and how to read each chunk's
    conversations again. A file with any problem (or that is not plain JSONL) is read whole the classic way,
    which names every problem with its line. A record the tokenizer cannot take (RecordError) is reported as
    FILE:LINE."""
    try:
        return _tokenize_file_in_chunks(path, chunks, chat, config, limit, folder, workers)
    except RecordError as exc:
        raise UserError(f"{path}:{exc.line}: {exc.reason}") from None


def _tokenize_file_in_chunks(
    path: str, chunks, chat: ChatTokenizer, config: RunConfig, limit: int | None, folder: Path, workers: int
) -> Tokenized:
    settings = _settings(config, limit)
    if chunks is not None:
        results = tokenize_chunks(
            chunks, chat, settings, str(folder), workers, config.model, config.trust_remote_code, config.chat_template
        )
        formats = {r.format for r in results if r.format is not None}
        if all(r.ok for r in results) and len(formats) <= 1 and any(r.conversations for r in results):
            sources = [partial(read_chunk_conversations, chunk, config.format) for chunk in chunks]
            return results, [], sources
        for result in results:  # the token files of the chunks that were fine: not needed after all
            for name in (result.ids_file, result.weights_file):
                if name is not None:
                    Path(name).unlink(missing_ok=True)
    conversations, skipped, data_format = read_conversations_and_format(path, config.format, config.skip_invalid)
    result = tokenize_conversations(conversations, chat, settings)
    result.format = data_format
    return [result], skipped_as_kept(skipped, config.sensitive_data), [lambda: conversations]


def _scan(path: str) -> tuple[str, list | None]:
    """sha256 of the file's bytes, and its chunks (None: not chunkable, it is read whole)."""
    try:
        if _chunkable(path):
            return scan_file(path)
        return file_digest(path), None
    except OSError:
        read_conversations(path)  # raises read.py's message for a missing or unreadable file
        raise


def prepare_data(
    config: RunConfig, tokenizer=None, workers: int | None = None, facts: ModelFacts | None = None
) -> PreparedData:
    """Read, validate, split, build records, tokenize and fit them to the limit (or read all that from the
    token cache).

    The limit is --max-seq-len, or Auto's choice from the records' whole lengths (seq_len.py, with the model's
    `facts` when the caller has them, else read there). Those lengths are kept in the token cache beside the
    tokens, so a later run chooses its limit, and finds the tokens for it, without tokenizing; a first run
    tokenizes every record whole once, chooses, then tokenizes again only the few records over the limit, in
    parts. Raises UserError for unusable input. `workers`: processes that tokenize (default: every core).
    """
    if not config.data:
        raise UserError("no training file given")
    if tokenizer is None and config.model:
        tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template)
    if tokenizer is None:
        return _estimated(config)

    data_digest, chunks = _scan(config.data)
    val_digest, val_chunks = _scan(config.val_file) if config.val_file else (None, None)
    base_key = cache.cache_key(config, tokenizer, data_digest, val_digest) if config.cache else None
    root = cache.cache_root(config)
    limit = None
    if config.max_seq_len != AUTO:
        limit = choose_max_seq_len(config, np.zeros(0))
    elif base_key is not None and (lengths := cache.load_lengths(root, cache.lengths_key(base_key))) is not None:
        limit = choose_max_seq_len(config, lengths, facts=facts)
    key = None if base_key is None or limit is None else cache.with_max_seq_len(base_key, limit.value)
    if key is not None and (hit := cache.load_entry(root, key)):
        folder, meta = hit
        prepared = prepared_data(load_tokenized(folder, meta, in_memory=False), config, limit)
        prepared.cache_entry, prepared.from_cache = str(folder), True
        return _stamped(prepared, data_digest, val_digest)

    chat = ChatTokenizer(tokenizer)
    tmp = cache.new_tmp_dir(root) if base_key is not None else None
    folder = tmp or Path(tempfile.mkdtemp(prefix="finetune-tokens-"))
    given = limit.value if limit is not None else None
    try:
        train, val, skipped, sources = _tokenize_files(config, (chunks, val_chunks), chat, given, folder, workers)
        results = train + (val or [])
        if base_key is not None:
            cache.store_lengths(root, cache.lengths_key(base_key), _whole_lengths(results))
        limit = limit or _fit_results(results, sources, chat, config, facts)
        sources.clear()  # a file read whole keeps its conversations in these: not needed any more
        meta = combine(folder, train, val, config, chat.end_of_turn_id)
        meta["skipped"] = skipped
        key = None if base_key is None else cache.with_max_seq_len(base_key, limit.value)
        stored = cache.store_entry(root, key, folder, meta) if tmp is not None else None
        if stored is not None:
            meta = json.loads((stored / "meta.json").read_text(encoding="utf-8"))["meta"]
            prepared = prepared_data(load_tokenized(stored, meta, in_memory=False), config, limit)
            prepared.cache_entry = str(stored)
            return _stamped(prepared, data_digest, val_digest)
        return _stamped(
            prepared_data(load_tokenized(folder, meta, in_memory=True), config, limit), data_digest, val_digest
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # gone already when it became the cache entry


def _tokenize_files(
    config: RunConfig, chunks: tuple, chat: ChatTokenizer, limit: int | None, folder: Path, workers: int | None
) -> tuple[list[ChunkResult], list[ChunkResult] | None, list[dict], list[Callable[[], list[Conversation]]]]:
    """The data file's chunks tokenized into `folder` (and the validation file's: None without one), the lines
    --skip-invalid left out, and how to read each chunk's conversations again."""
    workers = workers or default_workers()
    train, skipped, sources = _tokenize_file(config.data, chunks[0], chat, config, limit, folder, workers)
    skipped = stored_skipped(skipped, "data")
    if not config.val_file:
        return train, None, skipped, sources
    val, val_skipped, val_sources = _tokenize_file(config.val_file, chunks[1], chat, config, limit, folder, workers)
    return train, val, skipped + stored_skipped(val_skipped, "val_file"), sources + val_sources


def _estimated(config: RunConfig) -> PreparedData:
    """Without a tokenizer (no model): the files read and checked, token numbers estimated from the text."""
    train, skipped, data_format = read_conversations_and_format(config.data, config.format, config.skip_invalid)
    skipped = skipped_as_kept(skipped, config.sensitive_data)
    redact = config.sensitive_data == "redact"
    train, found = sensitive.scan_conversations(train, redact)
    found_by_source = {"data": found}
    val = None
    if config.val_file:
        val, val_skipped = read_conversations(config.val_file, config.format, config.skip_invalid)
        val, found_by_source["val_file"] = sensitive.scan_conversations(val, redact)
        skipped += skipped_as_kept(val_skipped, config.sensitive_data)
    found = sensitive_found({"sensitive": sensitive.of_sides(found_by_source, config.sensitive_data)}, config)
    sensitive.refuse_if_found(found)
    prepared = estimate(train, val, config)
    prepared.skipped = skipped
    replies = invented.summarize(
        invented.scan_replies(train), display_name(config.data), invented.trained_replies(train)
    )
    prepared.summary = replace(
        prepared.summary,
        skipped_lines=len(skipped),
        data_format=data_format,
        sensitive_found=found,
        invented_specifics=replies,
    )
    return prepared


def scanned_users_files(
    source: RunConfig, held_out: Collection[int] = (), general_data: str | None = None
) -> tuple[dict, dict]:
    """What a plan says of the user's own files when the run reads copies of them (the test split's train.jsonl, the
    replay mix), whose names and lines the user never saw and which hold placeholders (redact), each file named as
    the user named it, by its own lines: the sensitive values in the training file (less the lines `held_out` as a
    test split), the validation file and the general conversations replay mixed in (`general_data`); and the
    specifics the team's own trained replies state that their conversation never gave (never the replay rows', which
    are the base's answers). The training file is read once for both."""
    files = ((source.data, source.format, source.skip_invalid), (source.val_file, source.format, source.skip_invalid))
    found: dict[str, list] = {}
    replies = invented.summarize([], display_name(source.data), 0)
    for path, data_format, skip_invalid in (*files, (general_data, None, False)):
        if not path:
            continue
        conversations, _ = read_conversations(path, data_format, skip_invalid)
        if path != source.data:
            found[display_name(path)] = sensitive.scan_conversations(conversations)[1]
            continue
        trained, values, stated = invented.scan_both(conversations, source.sensitive_data == "redact")  # as trained
        found[display_name(path)] = [f for f in values if f.line not in held_out]
        kept = [c for c in trained if c.line not in held_out]
        stated = [f for f in stated if f.line not in held_out]
        replies = invented.summarize(stated, display_name(path), invented.trained_replies(kept))
    return sensitive.of_sides(found, source.sensitive_data), replies


def _stamped(prepared: PreparedData, data_digest: str, val_digest: str | None) -> PreparedData:
    """The files' sha256 in the summary: a plan carries them, and a trainer executing it checks them."""
    prepared.summary = replace(prepared.summary, data_sha256=data_digest, val_sha256=val_digest)
    return prepared
