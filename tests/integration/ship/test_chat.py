"""`finetune chat`: multi-turn from piped input, streamed, each answer the model's greedy reply to the whole chat."""

from __future__ import annotations

import io

import torch

from finetune.chat import stream_reply
from finetune.cli import main
from finetune.prompting import prompt_ids, stop_ids
from finetune.run_folder import load_for_generation, locate_weights


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
