"""MetricsLog and read_metrics: append, read back, truncate on resume, survive a torn last line."""

import json

import pytest

from finetune.report.metrics import MetricsLog, read_metrics


def row(step, **more):
    return {"step": step, "epoch": step / 10, "learning_rate": 1e-4, "train_loss": 2.0 - step / 100, **more}


def test_append_then_read(tmp_path):
    path = tmp_path / "out" / "metrics.jsonl"  # the folder is created
    log = MetricsLog(path)
    for step in range(1, 4):
        log.append(row(step))
    log.append(row(4, val_loss=1.9))
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[3]["val_loss"] == 1.9
    assert path.read_text().count("\n") == 4  # one line per row, each complete


def test_each_append_is_visible_to_a_reader_at_once(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append(row(1))
    assert len(read_metrics(log.path)) == 1
    log.append(row(2))
    assert len(read_metrics(log.path)) == 2


def test_missing_log_reads_as_empty(tmp_path):
    assert read_metrics(tmp_path / "nothing.jsonl") == []


def test_truncate_after_drops_later_steps(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in range(1, 11):
        log.append(row(step))
    assert log.truncate_after(6) == 4
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3, 4, 5, 6]
    log.append(row(7))  # the resumed run carries on from there
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3, 4, 5, 6, 7]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_reader_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    full = json.dumps(row(1)) + "\n" + json.dumps(row(2)) + "\n"
    path.write_text(full + json.dumps(row(3))[:17])  # the writer is mid-line
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_writer_drops_a_torn_last_line_before_appending(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(row(1)) + "\n" + json.dumps(row(2))[:10])  # crashed mid-line
    log = MetricsLog(path)
    log.append(row(2))
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(row(1)) + "\nnot json\n" + json.dumps(row(3)) + "\n")
    with pytest.raises(ValueError, match=":2:"):
        read_metrics(path)


def test_non_finite_losses_round_trip(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append(row(1, train_loss=float("nan")))
    assert read_metrics(log.path)[0]["train_loss"] != read_metrics(log.path)[0]["train_loss"]  # NaN
