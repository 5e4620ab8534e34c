"""The data path at scale: chunked, multi-process tokenization gives exactly the records of the one-pass path.

The reference below is the data path as it was before chunking (read the whole file, split the conversations,
tokenize record by record, each fitted to the limit by fitting.py); the chunked path must agree with it token
for token, line for line, also when Auto's limit is chosen after tokenizing and the over-long records are
fitted afterwards (refit).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from finetune.data import parallel
from finetune.data.arrays import TokenArrays
from finetune.data.fitting import fit_tokenized
from finetune.data.prepare import prepare_data, read_conversations
from finetune.data.records import build_records
from finetune.data.split import remove_overlap, split_conversations
from finetune.data.tokenize import ChatTokenizer, as_lists, load_tokenizer
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError

WORDS = ["router", "invoice", "refund", "password", "login", "outage", "plan", "delivery", "export", "key", "app"]


def _conversation(rng: random.Random, i: int) -> dict:
    messages = [{"role": "system", "content": "You are the support team."}] if i % 3 == 0 else []
    for turn in range(rng.randint(1, 3)):
        messages.append(
            {"role": "user", "content": f"#{i}.{turn} " + " ".join(rng.choices(WORDS, k=rng.randint(3, 30)))}
        )
        reply = {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 60)))}
        if turn == 0 and i % 7 == 0:
            reply["weight"] = 0.5
        messages.append(reply)
    return {"messages": messages}


def _write_data(tmp_path, n: int = 80, seed: int = 0, duplicates: int = 6, name: str = "train.jsonl") -> str:
    """n conversations, some copied (duplicates must stay on one side), blank lines in between, CRLF endings."""
    rng = random.Random(seed)
    rows = [json.dumps(_conversation(rng, i)) for i in range(n)]
    rows += rows[:duplicates]
    lines = []
    for i, row in enumerate(rows):
        lines.append(row)
        if i % 17 == 5:
            lines.append("")  # a blank line moves every later line number
    text = "\r\n".join(lines[:40]) + "\r\n" + "\n".join(lines[40:]) + "\n"
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _reference(config: RunConfig, tokenizer, limit: int) -> tuple[list, list]:
    """(train, val) TokenizedRecords the way the one-process path produced them, fitted to `limit`."""
    chat = ChatTokenizer(tokenizer)
    conversations = read_conversations(config.data)[0]
    if config.val_file:
        split = remove_overlap(conversations, read_conversations(config.val_file)[0])
    else:
        split = split_conversations(conversations, float(config.val_fraction), config.seed)

    def side(convs):
        records = [r for i, c in enumerate(convs) for r in build_records(c, i, config.record_policy)]
        fitted = [fit_tokenized(r, chat, limit, config.truncation)[0] for r in records]
        return [as_lists(part, outcome).record for kept in fitted for part, outcome, _ in kept]

    return side(split.train), side(split.val)


def _same_records(got, expected) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert (a.input_ids, a.labels, a.weights, a.line, a.truncated_tokens) == (
            b.input_ids,
            b.labels,
            b.weights,
            b.line,
            b.truncated_tokens,
        )


@pytest.fixture(scope="module")
def tokenizer(toy_model):
    return load_tokenizer(str(toy_model))


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 1500)  # many chunks from a small file


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "settings",
    [
        {"val_fraction": 0.2, "max_seq_len": 1024},
        {"val_fraction": 0.25, "max_seq_len": 60, "record_policy": "each", "seed": 3},  # shortened and dropped
        {"val_fraction": 0.0, "max_seq_len": 60, "truncation": "drop"},
        {"val_fraction": 0.2, "max_seq_len": 90},  # conversations split
        {"val_fraction": 0.2, "window": 90},  # Auto: over the model's window, chosen after tokenizing, then refit
    ],
)
def test_chunked_tokenization_equals_the_one_pass_path(tmp_path, tokenizer, small_chunks, workers, settings):
    settings = dict(settings)
    if "window" in settings:  # a model whose config.json has a small context window (no weights needed)
        (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": settings.pop("window")}))
        settings["model"] = str(tmp_path / "config.json")
    config = RunConfig(data=_write_data(tmp_path), cache=False, **settings)
    assert len(parallel.scan_file(config.data)[1]) > 4
    prepared = prepare_data(config, tokenizer, workers=workers)
    summary = prepared.summary
    if config.max_seq_len == "auto":
        assert summary.max_seq_len <= 90 and summary.split_at and "context window" in summary.max_seq_len_reason
    train, val = _reference(config, tokenizer, summary.max_seq_len)
    _same_records(prepared.train, train)
    _same_records(prepared.val, val)
    assert max(len(r) for r in train) <= summary.max_seq_len
    assert summary.tokens_in_file == sum(len(r) for r in train)
    assert summary.target_tokens == sum(r.num_targets for r in train)
    assert summary.truncated_tokens == sum(r.truncated_tokens for r in train)
    assert summary.conversations + summary.validation_conversations == 86


def test_validation_file_loses_its_copies_of_training_conversations(tmp_path, tokenizer, small_chunks):
    data = _write_data(tmp_path, n=60)
    val = _write_data(tmp_path, n=20, seed=0, duplicates=0, name="val.jsonl")  # the same first 20: all overlap
    extra = tmp_path / "val2.jsonl"
    new = _write_data(tmp_path, n=5, seed=9, duplicates=0, name="x.jsonl")
    extra.write_text(Path(val).read_text() + Path(new).read_text())
    config = RunConfig(data=data, val_file=str(extra), cache=False)
    prepared = prepare_data(config, tokenizer, workers=2)
    train, val_records = _reference(config, tokenizer, prepared.summary.max_seq_len)
    _same_records(prepared.train, train)
    _same_records(prepared.val, val_records)
    assert prepared.summary.duplicates_removed == 20 and prepared.summary.validation_conversations == 5


@pytest.mark.parametrize("with_tokenizer", [True, False], ids=["chunked, tokenized", "estimated"])
def test_duplicate_conversations_are_counted_with_their_first_lines(tmp_path, tokenizer, small_chunks, with_tokenizer):
    """Issue 26: train and plan warned of no duplicate; they count them and name the first lines."""
    from finetune.data.read import find_duplicates, read_file

    config = RunConfig(data=_write_data(tmp_path, duplicates=14), cache=False)
    prepared = prepare_data(config, tokenizer if with_tokenizer else None, workers=2)
    copies = [line for line, _ in find_duplicates(read_file(config.data).conversations)]
    assert len(copies) == 14
    assert prepared.summary.duplicate_conversations == 14
    assert list(prepared.summary.duplicate_lines) == copies[:10]


def test_scan_file_cuts_on_line_ends_and_numbers_lines(tmp_path):
    lines = [f'{{"n": {i}, "pad": "{"x" * (i % 50)}"}}' for i in range(300)]
    path = tmp_path / "lines.jsonl"
    path.write_bytes(("\r\n".join(lines[:100]) + "\n" + "\n".join(lines[100:])).encode())  # no final newline
    digest, chunks = parallel.scan_file(path, chunk_bytes=700)
    data = path.read_bytes()
    assert digest == hashlib.sha256(data).hexdigest()
    assert chunks[0].start == 0 and chunks[-1].end == len(data) and len(chunks) > 10
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before.end == after.start and data[before.end - 1 : before.end] == b"\n"
    for chunk in chunks:
        assert chunk.first_line == data[: chunk.start].count(b"\n") + 1
        first = data[chunk.start : data.index(b"\n", chunk.start) if chunk.end < len(data) else None]
        assert json.loads(first.split(b"\n")[0])["n"] == chunk.first_line - 1


def test_a_problem_in_a_later_chunk_is_reported_with_its_line(tmp_path, tokenizer, small_chunks):
    path = _write_data(tmp_path)
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    lines[70] = '{"messages": [{"role": "user", "content": "hi"}'  # cut JSON
    Path(path).write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(UserError, match=rf"{path}:71 \[not_json\]"):
        prepare_data(RunConfig(data=path, cache=False), tokenizer, workers=2)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_record_the_template_refuses_is_named_by_file_and_line(tmp_path, toy_model, small_chunks, workers):
    """Templates raise on what they refuse (Gemma's on a system message); this one on one message's text."""
    refusing = load_tokenizer(str(toy_model))
    refusing.chat_template = (
        "{%- for m in messages %}{%- if m['content'] == 'Refuse me.' %}{{ raise_exception('not this one') }}"
        "{%- endif %}{%- endfor %}" + refusing.chat_template
    )
    path = _write_data(tmp_path)
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    refused = {"messages": [{"role": "user", "content": "Refuse me."}, {"role": "assistant", "content": "ok"}]}
    lines[70] = json.dumps(refused)
    Path(path).write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{path}:71: the chat template refuses this conversation: not this one"):
        prepare_data(RunConfig(data=path, cache=False), refusing, workers=workers)


def test_empty_and_missing_files_say_so(tmp_path, tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="empty"):
        prepare_data(RunConfig(data=str(empty), cache=False), tokenizer)
    with pytest.raises(UserError, match="no such file"):
        prepare_data(RunConfig(data=str(tmp_path / "nope.jsonl"), cache=False), tokenizer)


def test_token_arrays_behave_like_a_list_of_records(tmp_path, tokenizer):
    prepared = prepare_data(RunConfig(data=_write_data(tmp_path), val_fraction=0, cache=False), tokenizer)
    records = list(prepared.train)
    arrays = TokenArrays.from_records(records)
    assert arrays == records and prepared.train == arrays
    assert arrays[-1] == records[-1] and arrays[3:9:2] == records[3:9:2] and arrays[::7] == records[::7]
    assert arrays.lengths.tolist() == [len(r) for r in records]
    assert arrays.num_targets.tolist() == [r.num_targets for r in records]
    picked = arrays.subset(np.array([5, 1, 5]))
    assert picked == [records[5], records[1], records[5]]
    assert TokenArrays.from_records([]) == [] and not TokenArrays.empty()


@pytest.mark.parametrize("seed", [0, 7, -3])
def test_conversation_rank_is_split_rank(tmp_path, seed):
    from finetune.data.split import _rank

    for conversation in read_conversations(_write_data(tmp_path, n=5))[0]:
        assert parallel.conversation_digests(conversation, seed)[1].hex() == _rank(seed, conversation)
