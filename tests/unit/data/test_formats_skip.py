"""--skip-invalid never trains a line it lists as skipped: a byte-order mark is a problem of the whole file."""

from __future__ import annotations

import json

import pytest

from finetune.data.read import read_file
from finetune.data.skipped import usable_conversations
from finetune.settings.errors import UserError

GOOD = {"prompt": "What is 2+2?", "completion": "4"}


def test_a_bom_cannot_be_skipped_around(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(GOOD) + "\n").encode() * 2)
    parsed = read_file(path)
    with pytest.raises(UserError, match="whole file") as info:
        usable_conversations(parsed, skip_invalid=True)
    assert f"{path}:1 [bom]" in str(info.value)


def test_skipped_lines_are_exactly_the_lines_not_trained(tmp_path):
    path = tmp_path / "data.json"  # a JSON array: skipped.jsonl holds each skipped item's own text
    items = [GOOD, {"prompt": "q"}, GOOD | {"completion": "four"}, {"prompt": 1, "completion": "x"}]
    path.write_text(json.dumps(items, indent=2))
    conversations, skipped = usable_conversations(read_file(path), skip_invalid=True)
    assert [c.line for c in conversations] == [1, 3]
    assert [(s["line"], s["codes"]) for s in skipped] == [(2, ["missing_content"]), (4, ["content_not_string"])]
    assert [json.loads(s["text"]) for s in skipped] == [items[1], items[3]]
