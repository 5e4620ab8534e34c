"""The chunked, cached data path with issue 11's formats: --format, --skip-invalid, .jsonl.gz and Parquet.

Every case compares with the classic read (read_file on the whole file), which is the reference for what a
file means: the chunks on several processes and the token cache must never change it.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from finetune.data import parallel
from finetune.data.prepare import prepare_data, read_conversations
from finetune.data.tokenize import load_tokenizer
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError


def _chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"question {i} " * (i % 4 + 1)}, {"role": "assistant", "content": f"answer {i}"}]}  # fmt: skip


def _sharegpt(i: int) -> dict:
    return {"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}]}


def _write(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(toy_model):
    return load_tokenizer(str(toy_model))


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 600)  # many chunks from a small file


def _ids(records) -> list[tuple]:
    return [(tuple(r.input_ids), tuple(r.weights), r.line) for r in records]


def _same(a, b) -> None:
    assert _ids(a.train) == _ids(b.train) and _ids(a.val) == _ids(b.val)
    assert replace(a.summary, data_sha256=None) == replace(b.summary, data_sha256=None)  # other bytes, same records


# ----------------------------------------------------------------------------- --skip-invalid and the cache


def _with_bad_lines(tmp_path: Path, name: str = "train.jsonl") -> str:
    rows: list = [_chat(i) for i in range(60)]
    rows[7] = '{"messages": [{"role": "user", "content": "cut'  # not JSON
    rows[41] = {"messages": [{"role": "user", "content": "no answer"}]}  # no assistant message
    return _write(tmp_path / name, rows)


def test_skip_invalid_lines_come_back_from_the_cache(tmp_path, tokenizer, small_chunks):
    data = _with_bad_lines(tmp_path)
    config = RunConfig(data=data, skip_invalid=True, cache_dir=str(tmp_path / "cache"))
    first = prepare_data(config, tokenizer, workers=2)
    assert not first.from_cache
    assert [(s["file"], s["line"]) for s in first.skipped] == [(data, 8), (data, 42)]
    assert first.summary.skipped_lines == 2
    again = prepare_data(config, tokenizer, workers=2)
    assert again.from_cache  # nothing tokenized, and still every skipped line to write to OUT/skipped.jsonl
    assert again.skipped == first.skipped and again.summary == first.summary
    _same(again, first)


def test_skipped_lines_from_the_cache_name_the_file_as_it_is_called_now(tmp_path, tokenizer):
    data = _with_bad_lines(tmp_path)
    prepare_data(RunConfig(data=data, skip_invalid=True, cache_dir=str(tmp_path / "cache")), tokenizer)
    moved = str(tmp_path / "renamed.jsonl")
    shutil.move(data, moved)  # same bytes: the same cache entry
    again = prepare_data(RunConfig(data=moved, skip_invalid=True, cache_dir=str(tmp_path / "cache")), tokenizer)
    assert again.from_cache
    assert {s["file"] for s in again.skipped} == {moved}


def test_skipped_lines_of_the_validation_file_keep_its_name(tmp_path, tokenizer):
    data = _with_bad_lines(tmp_path)
    val = _write(tmp_path / "val.jsonl", [_chat(100), "[1, 2]", _chat(101)])
    config = RunConfig(data=data, val_file=val, skip_invalid=True, cache_dir=str(tmp_path / "cache"))
    first = prepare_data(config, tokenizer)
    again = prepare_data(config, tokenizer)
    assert again.from_cache
    for prepared in (first, again):
        assert [(s["file"], s["line"], s["codes"]) for s in prepared.skipped][-1] == (val, 2, ["not_object"])
        assert prepared.summary.validation_conversations == 2


def test_without_skip_invalid_a_bad_file_is_refused_and_nothing_is_cached(tmp_path, tokenizer, small_chunks):
    data = _with_bad_lines(tmp_path)
    store = tmp_path / "cache"
    with pytest.raises(UserError, match=rf"{data}:8 \[not_json\].*\n.*{data}:42 "):
        prepare_data(RunConfig(data=data, cache_dir=str(store)), tokenizer, workers=2)
    assert not [p for p in store.glob("*") if not p.name.startswith(".")]


# ----------------------------------------------------------------------------- --format


def test_a_forced_format_reads_in_chunks_as_the_whole_file_does(tmp_path, tokenizer, small_chunks):
    data = _write(tmp_path / "share.jsonl", [_sharegpt(i) for i in range(50)])
    assert len(parallel.scan_file(data)[1]) > 3
    chunked = prepare_data(RunConfig(data=data, format="sharegpt", cache=False), tokenizer, workers=2)
    whole = prepare_data(RunConfig(data=data, format="sharegpt", cache=False), tokenizer, workers=1)
    detected = prepare_data(RunConfig(data=data, cache=False), tokenizer, workers=2)
    _same(chunked, whole)
    _same(chunked, detected)
    assert len(read_conversations(data, "sharegpt")[0]) == 50


def test_a_forced_format_that_does_not_fit_names_a_line(tmp_path, tokenizer, small_chunks):
    data = _write(tmp_path / "chat.jsonl", [_chat(i) for i in range(50)])
    with pytest.raises(UserError, match=rf"{data}:1 \["):
        prepare_data(RunConfig(data=data, format="sharegpt", cache=False), tokenizer, workers=2)


def test_the_forced_format_is_part_of_the_cache_key(tmp_path, tokenizer):
    data = _write(tmp_path / "share.jsonl", [_sharegpt(i) for i in range(30)])
    store = str(tmp_path / "cache")
    prepare_data(RunConfig(data=data, cache_dir=store), tokenizer)
    assert not prepare_data(RunConfig(data=data, format="sharegpt", cache_dir=store), tokenizer).from_cache
    assert prepare_data(RunConfig(data=data, format="sharegpt", cache_dir=store), tokenizer).from_cache


# ----------------------------------------------------------------------------- mixed formats across chunks


def test_a_mixed_format_file_reports_mixed_formats_with_its_lines(tmp_path, tokenizer, small_chunks):
    rows = [_chat(i) for i in range(40)] + [_sharegpt(i) for i in range(40, 45)] + [_chat(i) for i in range(45, 60)]
    data = _write(tmp_path / "mixed.jsonl", rows)
    chunks = parallel.scan_file(data)[1]
    assert any(c.first_line > 41 for c in chunks)  # the ShareGPT lines are not in the first chunk
    with pytest.raises(UserError) as caught:
        prepare_data(RunConfig(data=data, cache=False), tokenizer, workers=2)
    message = str(caught.value)
    for line in range(41, 46):
        assert f"{data}:{line} [mixed_formats]" in message
    assert "(from line 1)" in message


def test_a_chunk_wholly_in_another_format_is_still_mixed_formats(tmp_path, tokenizer, small_chunks):
    """Each chunk alone is fine (one format each): only the whole file shows the mix."""
    rows = [_chat(i) for i in range(30)] + [_sharegpt(i) for i in range(30, 60)]
    data = _write(tmp_path / "halves.jsonl", rows)
    with pytest.raises(UserError, match=rf"{data}:31 \[mixed_formats\]"):
        prepare_data(RunConfig(data=data, cache=False), tokenizer, workers=2)
    skipping = prepare_data(RunConfig(data=data, cache=False, skip_invalid=True), tokenizer, workers=2)
    assert [s["line"] for s in skipping.skipped] == list(range(31, 61))
    assert {c for s in skipping.skipped for c in s["codes"]} == {"mixed_formats"}
    assert skipping.summary.conversations + skipping.summary.validation_conversations == 30


# ----------------------------------------------------------------------------- gzip and Parquet


def test_a_gzip_file_gives_the_records_of_the_plain_file_and_is_cached(tmp_path, tokenizer):
    plain = _write(tmp_path / "train.jsonl", [_chat(i) for i in range(40)])
    packed = tmp_path / "train.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(plain).read_bytes()))
    store = str(tmp_path / "cache")
    from_plain = prepare_data(RunConfig(data=plain, cache_dir=store), tokenizer, workers=2)
    from_gz = prepare_data(RunConfig(data=str(packed), cache_dir=store), tokenizer, workers=2)
    assert not from_gz.from_cache  # other bytes, another key
    _same(from_gz, from_plain)
    again = prepare_data(RunConfig(data=str(packed), cache_dir=store), tokenizer)
    assert again.from_cache
    _same(again, from_plain)


def test_a_gzip_file_with_bad_lines_skips_them_with_their_line(tmp_path, tokenizer):
    plain = _with_bad_lines(tmp_path)
    packed = tmp_path / "train.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(plain).read_bytes()))
    with pytest.raises(UserError, match=rf"{packed}:8 \[not_json\]"):
        prepare_data(RunConfig(data=str(packed), cache=False), tokenizer)
    config = RunConfig(data=str(packed), skip_invalid=True, cache_dir=str(tmp_path / "cache"))
    first = prepare_data(config, tokenizer)
    again = prepare_data(config, tokenizer)
    assert again.from_cache
    for prepared in (first, again):
        assert [(s["file"], s["line"]) for s in prepared.skipped] == [(str(packed), 8), (str(packed), 42)]
        assert prepared.skipped[0]["text"].startswith('{"messages": [{"role": "user", "content": "cut')


def test_a_damaged_gzip_file_is_one_message(tmp_path, tokenizer):
    packed = tmp_path / "train.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"messages": []}\n')[:-6])
    with pytest.raises(UserError, match="not a readable gzip file"):
        prepare_data(RunConfig(data=str(packed), cache=False), tokenizer)


def test_a_parquet_file_gives_the_records_of_the_jsonl_file(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [_chat(i) for i in range(30)]
    plain = _write(tmp_path / "train.jsonl", rows)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "train.parquet")
    store = str(tmp_path / "cache")
    from_plain = prepare_data(RunConfig(data=plain, cache=False), tokenizer)
    from_parquet = prepare_data(RunConfig(data=str(tmp_path / "train.parquet"), cache_dir=store), tokenizer)
    _same(from_parquet, from_plain)
    assert prepare_data(RunConfig(data=str(tmp_path / "train.parquet"), cache_dir=store), tokenizer).from_cache


def test_the_summary_names_the_files_format_on_every_path(tmp_path, tokenizer, small_chunks):
    """Chunks on a pool, the whole file in one process (gzip), the token cache, and no tokenizer (estimates)."""
    import io

    from rich.console import Console

    from finetune.plan.build import build_plan
    from finetune.plan.render import render_plan

    share = _write(tmp_path / "share.jsonl", [_sharegpt(i) for i in range(50)])
    packed = tmp_path / "share.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(share).read_bytes()))
    store = str(tmp_path / "cache")
    chunked = prepare_data(RunConfig(data=share, cache_dir=store), tokenizer, workers=2)
    cached = prepare_data(RunConfig(data=share, cache_dir=store), tokenizer, workers=2)
    whole = prepare_data(RunConfig(data=str(packed), cache_dir=store), tokenizer)
    estimated = prepare_data(RunConfig(data=share), None)
    assert cached.from_cache and not chunked.from_cache
    for prepared in (chunked, cached, whole, estimated):
        assert prepared.summary.data_format == "sharegpt"
    plain = prepare_data(RunConfig(data=_write(tmp_path / "chat.jsonl", [_chat(i) for i in range(20)])), tokenizer)
    assert plain.summary.data_format == "chat"
    plan = build_plan(RunConfig(data=share, gpu="cpu"), chunked.summary)
    assert plan.to_dict()["data_format"] == "sharegpt"
    shown = io.StringIO()
    render_plan(plan, Console(file=shown, width=200))
    assert "messages; format ShareGPT (conversations)" in shown.getvalue()
