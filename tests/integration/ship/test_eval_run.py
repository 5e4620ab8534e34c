"""A run's own test set (train --test-fraction) and `finetune eval RUN --checkpoints --rule ...`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from finetune.commands.cli import main
from finetune.data.read import read_file
from finetune.data.split import split_conversations

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _keys(path: Path) -> list[tuple]:
    return [c.key() for c in read_file(str(path)).conversations]


def test_the_test_set_is_held_out_from_training_and_validation(lora_run):
    original = (EXAMPLES / "train.jsonl").read_text().splitlines()
    test_lines = (lora_run / "test.jsonl").read_text().splitlines()
    train_lines = (lora_run / "train.jsonl").read_text().splitlines()
    record = json.loads((lora_run / "test_split.json").read_text())
    assert sorted(test_lines + train_lines) == sorted(original)  # nothing lost, nothing added
    assert test_lines == [original[n - 1] for n in record["lines"]]
    assert record["conversations"] == len(test_lines) == round(0.1 * len(set(_keys(EXAMPLES / "train.jsonl"))))
    test_keys, train_keys = set(_keys(lora_run / "test.jsonl")), set(_keys(lora_run / "train.jsonl"))
    assert not test_keys & train_keys
    # validation is cut from what is left, with the plain seed: its own draw, disjoint from the test set
    plan = json.loads((lora_run / "plan.json").read_text())
    remaining = read_file(str(lora_run / "train.jsonl")).conversations
    val = split_conversations(remaining, plan["val_fraction"], 0).val
    assert len(val) == plan["validation_conversations"] and not {c.key() for c in val} & test_keys
    assert plan["conversations"] + plan["validation_conversations"] == len(train_lines)
    # the test draw is not the validation draw of the same seed
    whole = read_file(str(EXAMPLES / "train.jsonl")).conversations
    assert {c.key() for c in split_conversations(whole, 0.1, 0).val} != test_keys


def test_eval_run_scores_base_tuned_and_every_checkpoint(lora_run, capsys, tmp_path):
    rules = ["greeting=^Hi there", "signoff=Warm regards"]
    args = ["eval", str(lora_run), "--checkpoints", "--max-new-tokens", "6", "--limit", "5", "--show", "2"]
    assert main([*args, *[f"--rule={r}" for r in rules]]) == 0
    printed = capsys.readouterr().out
    result = json.loads((lora_run / "eval.json").read_text())
    assert list(result["models"]) == ["base", "tuned", "step-3", "step-6"]
    assert result["test_file"] == str(lora_run / "test.jsonl") and result["examples"] == 5
    for name in result["models"]:
        numbers = result["summary"][name]
        assert set(numbers) == {"exact_match", "token_f1", "rouge_l", "answer_length", "rule:greeting", "rule:signoff"}
        answers = [row[name] for row in result["rows"]]
        assert numbers["rule:signoff"] == sum(bool(re.search("Warm regards", a, re.S)) for a in answers) / 5
        assert numbers["answer_length"] == sum(len(a.split()) for a in answers) / 5
    for name in ("tuned", "step-3", "step-6"):
        w = result["win_rate"][name]
        assert w["wins"] + w["ties"] + w["losses"] == 5
    f1 = [row["scores"]["tuned"]["token_f1"] for row in result["rows"]]
    assert [ex["token_f1"] for ex in result["best"]] == sorted(f1, reverse=True)[:2]
    assert [ex["token_f1"] for ex in result["worst"]] == sorted(f1)[:2]
    assert result["best"][0]["reference"] in [row["reference"] for row in result["rows"]]
    html = (lora_run / "eval.html").read_text()
    assert "<table>" in html and "step-6" in html and "Best by token_f1 of tuned" in html
    assert "eval.html" in printed and "tuned" in printed

    # the final weights are the best checkpoint: same answers
    best = json.loads((lora_run / "report.json").read_text())["best_step"]
    assert [row["tuned"] for row in result["rows"]] == [row[f"step-{best}"] for row in result["rows"]]

    # each checkpoint's validation loss beside its answers, read from metrics.jsonl
    logged = [json.loads(line) for line in (lora_run / "metrics.jsonl").read_text().splitlines()]
    val = {row["step"]: row["val_loss"] for row in logged if "val_loss" in row}
    assert result["steps"] == {"tuned": best, "step-3": 3, "step-6": 6}
    assert result["val_loss"] == {"tuned": val[best], "step-3": val[3], "step-6": val[6]}
    assert f"{val[3]:.4f}" in html and f"{val[3]:.4f}" in printed

    # answers the team would sign (docs/answers.md): base, tuned, each checkpoint and the team's replies, the training
    # replies those of the run's own training file (what is left after the test set)
    grounding = result["grounding"]
    assert list(grounding["models"]) == ["base", "tuned", "step-3", "step-6", "reference"]
    assert grounding["training_file"] == "train.jsonl" and grounding["training_replies"] > 300
    for numbers in grounding["models"].values():
        assert {numbers[k]["n"] for k in ("invented", "recited", "distinct")} == {5}
        assert numbers["invented"]["low"] <= numbers["invented"]["rate"] <= numbers["invented"]["high"]
    assert all(set(row["grounding"]) == set(grounding["models"]) for row in result["rows"])
    for name, numbers in grounding["models"].items():  # the counts are those of the rows' own checks
        recited = [row["grounding"][name]["recites_line"] for row in result["rows"]]
        assert numbers["recited"]["count"] == sum(line is not None for line in recited)
        assert numbers["invented"]["count"] == sum(bool(row["grounding"][name]["invented"]) for row in result["rows"])
    assert "answers: tuned invents a specific in" in " ".join(printed.split()) and "recites a training" in printed
    assert "Answers the team would sign" in html

    # the model card of a later export carries the eval summary
    assert main(["export", str(lora_run), "--out", str(tmp_path / "exported"), "--adapter"]) == 0
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "## Evaluation" in card and "rule:signoff" in card and "| step-6 |" in card
    assert "## Answers the team would sign" in card and "| recites a training reply |" in card
    w = result["win_rate"]["tuned"]
    assert f"{w['win_rate']:.0%} ({w['wins']} wins, {w['ties']} ties, {w['losses']} losses)" in card
    assert "`greeting` = `^Hi there`" in card


def test_eval_refusals(lora_run, toy_model, tmp_path, capsys):
    assert main(["eval", str(EXAMPLES / "test.jsonl"), "--checkpoints", "--model", str(toy_model)]) == 1
    assert "run folder" in capsys.readouterr().err
    assert main(["eval", str(EXAMPLES / "test.jsonl")]) == 1
    assert "--model" in capsys.readouterr().err
    assert main(["eval", str(lora_run), "--test", str(tmp_path / "missing.jsonl")]) == 1
    assert "missing.jsonl" in capsys.readouterr().err
    for flag, value in (("--limit", "0"), ("--show", "-1"), ("--max-new-tokens", "0")):
        assert main(["eval", str(lora_run), flag, value]) == 1
        assert f"{flag} must be at least" in capsys.readouterr().err
    assert main(["eval", str(lora_run), "--rule", "no-equals-sign"]) == 1
    assert "NAME=REGEX" in capsys.readouterr().err
    assert main(["eval", str(lora_run), "--rule", "bad=("]) == 1
    assert "not a regular expression" in capsys.readouterr().err


def test_rules_read_the_whole_answer():
    from finetune.ship.eval.metrics import parse_rules, score

    rules = parse_rules(["greeting=^Hi there", r"signoff=Warm regards,\s*Sam$", "no_sorry=^(?!.*(?i:sorry))"])
    good = "Hi there, thanks!\n\nIt ships today.\n\nWarm regards,\nSam"
    late_greeting = "Thanks.\nHi there, it ships today.\nWarm regards,\nSam"
    apology = "Hi there!\nIt is late.\nSorry about that.\nWarm regards,\nSam"
    unsigned = "Hi there!\nWarm regards,\nSam\nP.S. it ships today"

    def passed(answer: str) -> dict[str, float]:
        return {name: score(answer, "ref", rules)[f"rule:{name}"] for name in rules}

    assert passed(good) == {"greeting": 1.0, "signoff": 1.0, "no_sorry": 1.0}
    assert passed(late_greeting)["greeting"] == 0.0  # the greeting comes first or not at all
    assert passed(apology)["no_sorry"] == 0.0  # a forbidden phrase on any line, any case
    assert passed(unsigned)["signoff"] == 0.0  # the sign-off ends the answer
