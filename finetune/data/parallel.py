"""Read and tokenize a JSONL file in line-aligned chunks, on every core, into compact arrays.

    digest, chunks = scan_file(path)                 # one pass: sha256 of the bytes + chunk boundaries
    results = tokenize_chunks(chunks, chat, settings, out_dir, workers)

Each chunk is parsed and validated by read.py (`parse_bytes`), turned into records (records.py) and
tokenized record by record (`ChatTokenizer.tokenize_arrays`), exactly as the one-process path does; only the
bookkeeping is different. A worker writes its chunk's token ids and weights to two raw files in
`out_dir` and sends back small per-record and per-conversation arrays, so neither the workers nor the
main process ever hold the whole file's tokens as Python objects.

A chunk with any problem (or chunks that disagree on the format) makes the caller re-read the whole file
the classic way, which names every problem with its line; the fast path is only for files that are fine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from finetune.data import invented
from finetune.data.fitting import Fit, fit_tokenized
from finetune.data.read import parse_bytes
from finetune.data.records import build_records
from finetune.data.sensitive import redacted
from finetune.data.tokenize import ChatTokenizer, EncodedOutcome, load_tokenizer
from finetune.data.types import Conversation

CHUNK_BYTES = 4 << 20  # ~2,000 support conversations: enough work per task, small enough to spread over cores
_READ_BLOCK = 1 << 20


@dataclass(frozen=True)
class Chunk:
    path: str
    index: int
    start: int  # byte offset of the chunk's first line
    end: int  # byte offset just past its last newline (or the end of the file)
    first_line: int  # 1-based number of that first line in the file


@dataclass(frozen=True)
class TokenizeSettings:
    """Everything besides the tokenizer that decides the tokens of a chunk."""

    max_seq_len: int | None  # None: every record is kept whole, to be fitted (`refit`) once the limit is chosen
    truncation: str
    record_policy: str
    seed: int
    format: str | None = None  # --format: a forced data format (None or "auto": detected per chunk)
    sensitive_data: str = "warn"  # redact: values found (sensitive.py) are replaced by placeholders before tokenizing


@dataclass
class ChunkResult:
    """One chunk, tokenized. Conversation indices are local to the chunk; lines are the file's."""

    index: int
    ok: bool = True  # False: the chunk has a problem, re-read the file for the full report
    format: str | None = None
    # per conversation
    conv_digest: np.ndarray = field(default_factory=lambda: np.zeros((0, 32), np.uint8))  # sha256 of its key
    conv_rank: np.ndarray = field(default_factory=lambda: np.zeros((0, 32), np.uint8))  # split.py's rank
    conv_messages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per kept record
    rec_conv: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rec_line: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rec_len: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rec_targets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rec_truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rec_first_is_target: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    rec_learns_end: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # end-of-turn is a target
    rec_fit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # fitting.Fit of each kept record
    # records that did not fit: (local conversation, line, reason, their tokens)
    dropped: list[tuple[int, int, str, int]] = field(default_factory=list)
    # per record built (before fitting): its whole length in tokens, what Auto's max_seq_len is chosen from
    src_len: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # sensitive values found in the chunk's messages (where and what kind, never the value): sensitive.py
    sensitive: list = field(default_factory=list)
    # specifics its trained replies state that their conversation never gave (counts, lines; never a value): invented.py
    invented: dict = field(default_factory=lambda: invented.summarize([], "data", 0))
    # token buffers: raw int32 ids / float32 weights, in files (pool) or in memory (inline)
    ids_file: str | None = None
    weights_file: str | None = None
    ids: np.ndarray | None = None
    weights: np.ndarray | None = None

    @property
    def conversations(self) -> int:
        return len(self.conv_messages)

    @property
    def tokens(self) -> int:
        return int(self.rec_len.sum())


# ----------------------------------------------------------------------------- the file, in chunks


def scan_file(path: str | Path, chunk_bytes: int | None = None) -> tuple[str, list[Chunk]]:
    """One pass over the bytes: their sha256, and chunks that end on a newline with their first line number."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    digest = hashlib.sha256()
    chunks: list[Chunk] = []
    start, first_line = 0, 1
    pos, newlines = 0, 0  # bytes and newlines before the current block
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            digest.update(block)
            while (cut_from := start + chunk_bytes - pos) < len(block):
                newline = block.find(b"\n", max(0, cut_from))
                if newline < 0:
                    break
                chunks.append(Chunk(str(path), len(chunks), start, pos + newline + 1, first_line))
                start, first_line = pos + newline + 1, newlines + block.count(b"\n", 0, newline + 1) + 1
            newlines += block.count(b"\n")
            pos += len(block)
    if pos > start:
        chunks.append(Chunk(str(path), len(chunks), start, pos, first_line))
    return digest.hexdigest(), chunks


def file_digest(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ----------------------------------------------------------------------------- one chunk


def conversation_digests(conversation: Conversation, seed: int) -> tuple[bytes, bytes]:
    """(identity, rank) of a conversation: sha256 of Conversation.key() for duplicates and overlap, and
    split.py's `_rank(seed, conversation)` (sha256 of the JSON of [seed, key]), from one JSON encoding."""
    key = json.dumps(conversation.key(), ensure_ascii=False)
    rank = f"[{json.dumps(seed)}, {key}]"  # == json.dumps([seed, key()]): the test against split.py checks it
    return hashlib.sha256(key.encode("utf-8")).digest(), hashlib.sha256(rank.encode("utf-8")).digest()


class _Rows:
    """The kept records of a chunk as they are appended: one row of numbers and two token arrays each."""

    def __init__(self, end_of_turn_id: int) -> None:
        self.eot = end_of_turn_id
        self.rows: list[tuple[int, ...]] = []
        self.ids: list[np.ndarray] = []
        self.weights: list[np.ndarray] = []

    def add(self, local: int, line: int, ids: np.ndarray, weights: np.ndarray, cut: int, fit: int) -> None:
        weights = weights.astype(np.float32, copy=False)
        targets = weights > 0  # where arrays.py rebuilds a label from the stored weights
        first_is_target = bool(len(targets) and targets[0])
        learns_end = bool((ids[targets] == self.eot).any())
        self.rows.append((local, line, len(ids), int(targets.sum()), cut, first_is_target, learns_end, fit))
        self.ids.append(ids)
        self.weights.append(weights)

    def into(self, result: ChunkResult) -> None:
        table = np.array(self.rows, dtype=np.int64).reshape(-1, 8)
        result.rec_conv, result.rec_line, result.rec_len, result.rec_targets, result.rec_truncated = table[:, :5].T
        result.rec_first_is_target, result.rec_learns_end = table[:, 5].astype(bool), table[:, 6].astype(bool)
        result.rec_fit = table[:, 7].astype(np.int8)
        result.ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int32)
        result.weights = np.concatenate(self.weights) if self.weights else np.zeros(0, np.float32)


def _add_fitted(rows: _Rows, result: ChunkResult, local: int, record, chat, settings: TokenizeSettings, whole) -> None:
    """One record fitted to the limit (fitting.py's policy): its kept parts as rows, its dropped parts listed."""
    kept, dropped = fit_tokenized(record, chat, settings.max_seq_len, settings.truncation, whole)
    for part, outcome, kind in kept:
        rows.add(local, part.line, outcome.input_ids, outcome.weights, outcome.cut_tokens, int(kind))
    for part, outcome in dropped:
        result.dropped.append((local, part.line, outcome.dropped or "", outcome.total_tokens))


def tokenize_conversations(conversations: list[Conversation], chat, settings: TokenizeSettings, index: int = 0):
    """Records of `conversations`, each tokenized whole (`chat.tokenize_whole`) and fitted to the limit
    (fitting.py); with `settings.max_seq_len` None, kept whole for `refit` once the limit is chosen."""
    result = ChunkResult(index)
    # what is trained on is read for invented specifics: with redact, placeholders are no specifics
    conversations, result.sensitive, found = invented.scan_both(conversations, settings.sensitive_data == "redact")
    result.invented = invented.summarize(found, "data", invented.trained_replies(conversations))
    n = len(conversations)
    result.conv_digest = np.zeros((n, 32), np.uint8)
    result.conv_rank = np.zeros((n, 32), np.uint8)
    result.conv_messages = np.array([len(c.messages) for c in conversations], dtype=np.int64)
    rows = _Rows(chat.end_of_turn_id)
    whole_lengths: list[int] = []
    for local, conversation in enumerate(conversations):
        identity, rank = conversation_digests(conversation, settings.seed)
        result.conv_digest[local] = np.frombuffer(identity, np.uint8)
        result.conv_rank[local] = np.frombuffer(rank, np.uint8)
        for record in build_records(conversation, local, settings.record_policy):
            whole = chat.tokenize_whole(record)
            whole_lengths.append(whole.total_tokens)
            if settings.max_seq_len is None or whole.total_tokens <= settings.max_seq_len:
                rows.add(local, record.line, whole.input_ids, whole.weights, 0, int(Fit.WHOLE))
            else:
                _add_fitted(rows, result, local, record, chat, settings, whole)
    rows.into(result)
    result.src_len = np.array(whole_lengths, dtype=np.int64)
    return result


def refit(result: ChunkResult, conversations: list[Conversation], chat, settings: TokenizeSettings) -> None:
    """A chunk tokenized whole (max_seq_len None), fitted in place to `settings.max_seq_len`: only its records
    over the limit are built and tokenized again (the rest keep their tokens), so the result is the one
    `tokenize_conversations` gives with that limit from the start."""
    limit = settings.max_seq_len
    if not (result.rec_len > limit).any():
        return
    ids, weights = _buffers(result)
    starts = np.concatenate([[0], np.cumsum(result.rec_len)[:-1]]).astype(np.int64)
    first_row = {}  # conversation -> its first row: rows follow build_records' order, one per record
    for row, local in enumerate(result.rec_conv.tolist()):
        first_row.setdefault(local, row)
    rows = _Rows(chat.end_of_turn_id)
    built: dict[int, list] = {}
    for row, (local, length) in enumerate(zip(result.rec_conv.tolist(), result.rec_len.tolist(), strict=True)):
        span = slice(starts[row], starts[row] + length)
        if length <= limit:
            rows.add(local, int(result.rec_line[row]), ids[span], weights[span], 0, int(Fit.WHOLE))
            continue
        if local not in built:
            conversation = conversations[local]
            if settings.sensitive_data == "redact":  # the same placeholders as when it was tokenized whole
                conversation = redacted([conversation])[0]
            built[local] = build_records(conversation, local, settings.record_policy)
        record = built[local][row - first_row[local]]
        whole = EncodedOutcome(np.asarray(ids[span]), np.asarray(weights[span], dtype=np.float64), None, length, 0)
        _add_fitted(rows, result, local, record, chat, settings, whole)
    rows.into(result)
    if result.ids_file is not None:  # the pool's token files: written again, the new tokens in place of the old
        result.ids.tofile(result.ids_file)
        result.weights.tofile(result.weights_file)
        result.ids = result.weights = None


def _buffers(result: ChunkResult) -> tuple[np.ndarray, np.ndarray]:
    if result.ids_file is None:
        return result.ids, result.weights
    return np.fromfile(result.ids_file, dtype=np.int32), np.fromfile(result.weights_file, dtype=np.float32)


def _read_chunk(chunk: Chunk, format: str | None = None) -> tuple[list[Conversation] | None, str | None]:
    """The chunk's conversations with the file's line numbers, or None when it has any problem."""
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        data = f.read(chunk.end - chunk.start)
    if not data.strip():
        return [], None  # blank lines only (e.g. at the end of the file): a warning at most
    if chunk.index > 0 and data.startswith(b"\xef\xbb\xbf"):
        return None, None  # a BOM inside the file: let the full read report it in its words
    parsed = parse_bytes(data, chunk.path, format)
    if not parsed.ok:
        return None, parsed.format
    conversations = parsed.conversations
    if chunk.first_line > 1:  # parse_bytes numbers the chunk's lines from 1
        conversations = [dataclasses.replace(c, line=c.line + chunk.first_line - 1) for c in conversations]
    return conversations, parsed.format


def read_chunk_conversations(chunk: Chunk, format: str | None = None) -> list[Conversation]:
    """A chunk's conversations again (one that was read fine before), for `refit`."""
    conversations, _ = _read_chunk(chunk, format)
    return conversations or []


_CHAT = None  # in a pool worker: the ChatTokenizer, inherited through fork or loaded by _init_worker
_SETTINGS: TokenizeSettings | None = None
_OUT_DIR: str | None = None


def _init_worker(
    model: str | None,
    trust_remote_code: bool,
    settings: TokenizeSettings,
    out_dir: str,
    chat=None,
    chat_template: str = "auto",
) -> None:
    global _CHAT, _SETTINGS, _OUT_DIR
    _CHAT, _SETTINGS, _OUT_DIR = chat, settings, out_dir
    if multiprocessing.parent_process() is not None:  # a pool worker: the pool uses the cores already, so
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # no Rust threads per batch on top (read per call)
    if _CHAT is None and model is not None:  # spawn: no inherited tokenizer
        _CHAT = ChatTokenizer(load_tokenizer(model, trust_remote_code, chat_template))


def _run_chunk(chunk: Chunk) -> ChunkResult:
    """In a pool worker: one chunk, with what the pool's initializer set."""
    return _tokenize_chunk(chunk, _CHAT, _SETTINGS, _OUT_DIR)


def _tokenize_chunk(chunk: Chunk, chat, settings: TokenizeSettings | None, out_dir: str | None) -> ChunkResult:
    conversations, fmt = _read_chunk(chunk, settings.format if settings else None)
    if conversations is None:
        return ChunkResult(chunk.index, ok=False, format=fmt)
    result = tokenize_conversations(conversations, chat, settings, chunk.index)
    result.format = fmt
    if out_dir is not None:  # hand the tokens over as files: no large pickles between processes
        stem = Path(out_dir) / f"chunk-{chunk.index:06d}-{uuid.uuid4().hex[:12]}"
        result.ids_file, result.weights_file = str(stem) + ".ids", str(stem) + ".weights"
        result.ids.tofile(result.ids_file)
        result.weights.tofile(result.weights_file)
        result.ids = result.weights = None
    return result


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def tokenize_chunks(
    chunks: list[Chunk],
    chat,
    settings: TokenizeSettings,
    out_dir: str | None,
    workers: int,
    model: str | None = None,
    trust_remote_code: bool = False,
    chat_template: str = "auto",
) -> list[ChunkResult]:
    """Every chunk's result, in file order; on several processes when there are several chunks and workers.

    Workers are forked from this process, so they share its loaded tokenizer; where fork is not available
    they load it again from `model`.
    """
    processes = min(workers, len(chunks))
    if processes <= 1:  # in this process: no module state, so concurrent calls (the API's threads) stay apart
        return [_tokenize_chunk(chunk, chat, settings, out_dir) for chunk in chunks]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    inherited = chat if context.get_start_method() == "fork" else None  # forked: passed as is, never pickled
    initargs = (model, trust_remote_code, settings, out_dir, inherited, chat_template)
    # an executor, not multiprocessing.Pool: a chunk that raises (a record the template refuses) must stop the
    # work cleanly; Pool.terminate() with chunks still queued could wait forever on its own task thread
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_init_worker, initargs=initargs) as pool:
        futures = [pool.submit(_run_chunk, chunk) for chunk in chunks]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()  # the chunks not started are dropped; the running ones end, then the workers
            raise
