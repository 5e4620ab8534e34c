"""What a run bills (issue 47, rules/billing.py): the tenant's own general conversations (general_data) are billed like
its training file; only the rows the base model answered are not; the loop's count is what report.json bills, checked
against the schedule, and plan.json, report.json and the model card say what was billed and why."""

from __future__ import annotations

import json

from finetune.run import plan_run, train
from finetune.settings.config import RunConfig

RUN = {"general_val": False, "adapter_scale": "off", "epochs": 1, "batch_size": 4, "gpu": "cpu"}


def _general(tmp_path, rows: int = 40):
    """A large file of the tenant's own general conversations (10 of them per team row at replay 10, the most)."""
    path = tmp_path / "general.jsonl"
    lines = [{"messages": [{"role": "user", "content": f"Name a colour, any colour, number {i}."},
                           {"role": "assistant", "content": f"Blue, the colour of the sea, number {i}."}]}
             for i in range(rows)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in lines), encoding="utf-8")
    return str(path)


def test_general_data_is_the_tenants_own_and_billed_like_the_training_file(team, toy_model, tmp_path):
    general = _general(tmp_path)
    off = plan_run(RunConfig(data=team, model=str(toy_model), replay="off", **RUN), tmp_path / "off", measure=False)
    on = plan_run(RunConfig(data=team, model=str(toy_model), replay=2.0, general_data=general, **RUN), tmp_path / "on",
                  measure=False)  # fmt: skip
    added = on.plan.replay_added
    assert added["billed"] is True and added["source"] == general and added["rows"] > 0
    # every token trained on is the tenant's own: all of it billed, the general rows' share named
    assert on.plan.tokens_processed == on.plan.tokens_trained == on.plan.data.tokens_in_file * on.plan.epochs
    assert on.plan.tokens_processed == off.plan.tokens_processed + added["tokens_processed"] > off.plan.tokens_processed
    document = on.plan.to_dict()
    assert document["tokens_billed"] == on.plan.tokens_processed == on.plan.cost.billed_tokens
    bill = document["billing"]
    assert bill["general_data_tokens"] == added["tokens_processed"] and bill["not_billed_tokens"] == 0
    assert bill["training_file_tokens"] == off.plan.tokens_processed
    assert "general conversations (--general-data)" in bill["message"]
    # Auto still sizes passes and batch by the team's records alone
    assert (on.plan.epochs, on.plan.effective_batch) == (off.plan.epochs, off.plan.effective_batch)


def test_the_report_bills_what_the_loop_counted_and_says_why(team, toy_model, tmp_path):
    general = _general(tmp_path, rows=12)
    config = RunConfig(data=team, model=str(toy_model), out=str(tmp_path / "run"), replay=0.5, general_data=general,
                       max_steps=5, **RUN)  # fmt: skip
    result = train(config)
    report, plan = result.report, result.plan
    assert report["tokens_billed"] == report["tokens_processed"] == result.loop.tokens_billed == plan.tokens_processed
    assert report["tokens_match"] is True and report["tokens_billed"] == report["tokens_trained"]
    bill = report["billing"]
    assert bill["tokens_billed"] == report["tokens_billed"] and bill["schedule_check"]["agrees"] is True
    assert bill["counted"].startswith("counted by the training loop")
    card = (tmp_path / "run" / "adapter" / "README.md").read_text()
    assert f"| tokens billed | {report['tokens_billed']:,} |" in card and "general conversations" in card
