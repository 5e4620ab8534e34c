"""Answers the team would sign (docs/answers.md): the three measures for each model and the team's references, each
with its Wilson interval, the verdict against the references and the base, and the one line the demo prints."""

from __future__ import annotations

import json

from finetune.data.recitation import TrainingReplies
from finetune.data.types import Conversation, Message
from finetune.ship.eval.grounding import REFERENCE, line, measure, training_replies_of
from finetune.ship.eval.intervals import wilson

TRAINED = "I have started a refund for order BR-141850. It usually appears within 5 to 7 business days."


def _test_set(n: int = 20) -> list[Conversation]:
    return [
        Conversation(
            (
                Message("user", f"Please refund my order BR-{700000 + i}."),
                Message("assistant", f"I have started a refund for order BR-{700000 + i}. It arrives in 5 days."),
            ),
            line=i + 1,
        )
        for i in range(n)
    ]


def _training() -> tuple[TrainingReplies, str]:
    conversation = Conversation((Message("user", "Refund BR-141850"), Message("assistant", TRAINED)), line=1)
    return TrainingReplies.from_conversations([conversation]), "train.jsonl"


def test_each_measure_for_base_tuned_and_references():
    conversations = _test_set()
    base = [f"Start a return for order BR-{700000 + i} from the orders page." for i in range(20)]  # grounded, distinct
    tuned = [TRAINED] * 12 + [f"Refund started for BR-{700000 + i}." for i in range(12, 20)]  # 12 recitals
    section, rows = measure(conversations, {"base": base, "tuned": tuned}, _training())
    models = section["models"]
    assert list(models) == ["base", "tuned", REFERENCE] and section["answers"] == 20
    assert models["tuned"]["invented"]["count"] == 12 and models["tuned"]["invented"]["by_kind"] == {"identifier": 12}
    assert (models["tuned"]["invented"]["low"], models["tuned"]["invented"]["high"]) == wilson(12, 20)
    assert models["tuned"]["recited"]["count"] == 12 and models["tuned"]["distinct"]["count"] == 9
    assert models["base"]["invented"]["count"] == models["base"]["recited"]["count"] == 0
    assert models["base"]["distinct"]["count"] == 20
    assert models[REFERENCE]["invented"]["rate"] == 0.0 and models[REFERENCE]["distinct"]["count"] == 20
    assert rows["tuned"][0] == {"invented": ["identifier"], "recites_line": 1} and rows["tuned"][19]["invented"] == []
    # the verdict: the tuned model invents more than the references and recites more than the base, beyond chance
    assert section["flag"] and section["invented_vs_reference"]["low"] > 0 and section["recited_vs_base"]["low"] > 0
    assert section["remedies"] and section["message"] == line(section)
    assert line(section).startswith("tuned invents a specific in 60% (39%-78%) of 20 answers, the team's replies in 0%")
    assert "recites a training reply in 12 of 20 (base 0); 9 distinct answers of 20 (the team's 20)" in line(section)
    json.dumps(section)  # eval.json, demo.json and the service's results keep it as it is


def test_without_the_training_file_recitals_are_not_measured():
    conversations = _test_set(5)
    answers = [c.messages[-1].content for c in conversations]
    section, _ = measure(conversations, {"tuned": answers})
    assert section["models"]["tuned"]["recited"] is None and section["recited_vs_base"] is None
    assert not section["flag"] and "recitals not measured" in line(section)


def test_the_training_replies_of_a_run_are_its_plan_s_data_file(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})
    )
    (tmp_path / "plan.json").write_text(json.dumps({"settings": {"data": str(data)}}))
    replies, name = training_replies_of(tmp_path)
    assert len(replies) == 1 and name == "train.jsonl"
    data.unlink()
    assert training_replies_of(tmp_path) == (None, None)  # moved away: recitals are not measured, nothing fails
