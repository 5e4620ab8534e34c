"""`finetune chat`: multi-turn from piped input, streamed, each answer the model's greedy reply to the whole chat."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from finetune.commands.chat import chat_loop, stream_reply
from finetune.commands.cli import main
from finetune.data.prompting import end_of_turn_id, prompt_ids, stop_ids
from finetune.ship.run_folder import load_for_generation, locate_weights

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _greedy(model, tokenizer, messages: list[dict]) -> str:
    ids = torch.tensor([prompt_ids(tokenizer, messages)])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=stop_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


def test_piped_multi_turn_chat(lora_run, monkeypatch, capsys):
    lines = ["Hi, my parcel is late.", "/reset", "Can I get a refund?", "And how long does it take?"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["chat", str(lora_run), "--system", "Be brief.", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    answers = [line.removeprefix("assistant> ").strip() for line in out.splitlines() if line.startswith("assistant> ")]

    model, tokenizer = load_for_generation(locate_weights(lora_run))
    system = {"role": "system", "content": "Be brief."}
    first = _greedy(model, tokenizer, [system, {"role": "user", "content": lines[0]}])
    second_turn = [system, {"role": "user", "content": lines[2]}]  # /reset dropped the first exchange
    second = _greedy(model, tokenizer, second_turn)
    third = _greedy(
        model,
        tokenizer,
        [*second_turn, {"role": "assistant", "content": second}, {"role": "user", "content": lines[3]}],
    )
    assert answers == [first, second, third]
    assert "(conversation cleared)" in out


def test_replies_stream_in_pieces(lora_run):
    model, tokenizer = load_for_generation(locate_weights(lora_run), None)
    pieces = list(stream_reply(model, tokenizer, [{"role": "user", "content": "Hello"}], max_new_tokens=8))
    assert len(pieces) > 1 and "".join(pieces).strip() == _greedy(
        model, tokenizer, [{"role": "user", "content": "Hello"}]
    )


def test_chat_with_a_checkpoint_and_a_missing_one(lora_run, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    assert main(["chat", str(lora_run), "--checkpoint", "3", "--max-new-tokens", "4"]) == 0
    assert "assistant> " in capsys.readouterr().out
    assert main(["chat", str(lora_run), "--checkpoint", "4"]) == 1
    assert "no checkpoint at step 4" in capsys.readouterr().err


class _Recorder:
    """Stands in for the model: answers each turn with the team's reply from the file, keeps the prompts it got."""

    device = torch.device("cpu")

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.prompts, self.pending = tokenizer, list(replies), [], []

    def forward(self, input_ids, **kwargs):
        if input_ids.shape[1] > 1:  # a new reply: this pass reads the prompt (then one token a pass)
            self.prompts.append(input_ids[0].tolist())
            reply = self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"]
            self.pending = reply + [end_of_turn_id(self.tokenizer)]
        logits = torch.zeros(1, input_ids.shape[1], len(self.tokenizer))
        logits[0, -1, self.pending.pop(0)] = 1.0  # the decoder picks the reply's next token
        return SimpleNamespace(logits=logits)

    __call__ = forward


def test_chat_prompts_are_the_training_tokens(lora_run):
    """Every prompt chat sends is token for token the start of the record training built from that conversation."""
    from finetune.data.read import read_file
    from finetune.data.records import build_records
    from finetune.data.tokenize import ChatTokenizer

    _, tokenizer = load_for_generation(locate_weights(lora_run))
    conversations = read_file(str(EXAMPLES / "train.jsonl")).conversations
    multi_turn = [c for c in conversations if sum(m.role == "assistant" for m in c.messages) > 1][:5]
    assert multi_turn
    for conversation in multi_turn:
        messages = conversation.messages
        system = messages[0].content if messages[0].role == "system" else None
        users = [m.content for m in messages if m.role == "user"]
        replies = [m.content for m in messages if m.role == "assistant"]
        model = _Recorder(tokenizer, replies)
        chat_loop(model, tokenizer, system, 1000, source=io.StringIO("\n".join(users) + "\n"), sink=io.StringIO())

        record = build_records(conversation, 0, "all")[0]
        trained = ChatTokenizer(tokenizer).tokenize(record, 100_000, "left").record.input_ids
        assert len(model.prompts) == len(replies)
        for prompt in model.prompts:
            assert trained[: len(prompt)] == prompt
        assert model.prompts[-1] != model.prompts[0]  # later turns carry the earlier ones


def test_bad_runs_are_named(tmp_path, capsys):
    assert main(["chat", str(tmp_path / "nowhere")]) == 1
    assert "nowhere is not a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["chat", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "holds no adapter/ or model/" in err and "Traceback" not in err


def test_a_failing_generation_is_raised_not_waited_on(lora_run):
    class Broken:
        device = torch.device("cpu")

        def forward(self, **kwargs):
            raise RuntimeError("out of memory")

        __call__ = forward

    _, tokenizer = load_for_generation(locate_weights(lora_run))
    pieces = stream_reply(Broken(), tokenizer, [{"role": "user", "content": "Hello"}], max_new_tokens=4)
    with pytest.raises(RuntimeError, match="out of memory"):
        list(pieces)
