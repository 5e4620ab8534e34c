"""`finetune chat RUN [--system TEXT] [--checkpoint STEP]`: talk to the tuned model in the terminal.

Multi-turn: each answer joins the conversation, and the whole conversation is rendered with the chat
template exactly as training rendered it (finetune/data/prompting.py). Tokens are printed as they are
generated. One message per line; `/reset` starts over, `/exit` (or end of input) quits, so a
conversation can also be piped in: `printf 'hi\\nthanks\\n' | finetune chat runs/one`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from threading import Thread
from typing import TextIO

import torch

from finetune.data.prompting import prompt_ids, stop_ids
from finetune.ship.run_folder import load_for_generation, locate_weights, team_system_of


def stream_reply(
    model, tokenizer, messages: list[dict], max_new_tokens: int, temperature: float = 0.0
) -> Iterator[str]:
    """The model's next reply, piece by piece as tokens arrive (decoded by transformers' streamer)."""
    from transformers import TextIteratorStreamer

    ids = torch.tensor([prompt_ids(tokenizer, messages)], device=model.device)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    kwargs = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids(tokenizer)[0],
        streamer=streamer,
        **sampling,
    )
    failure: list[BaseException] = []
    worker = Thread(target=_generate, args=(model, kwargs, failure), daemon=True)
    worker.start()
    yield from streamer
    worker.join()
    if failure:  # raised here, in the reader's thread: a failed generation must not leave chat waiting forever
        raise failure[0]


@torch.no_grad()
def _generate(model, kwargs: dict, failure: list[BaseException]) -> None:
    try:
        model.generate(**kwargs)
    except BaseException as exc:
        failure.append(exc)
        kwargs["streamer"].end()  # release the reader


def _read_line(source: TextIO, interactive: bool) -> str | None:
    if interactive:
        try:
            return input("you> ")
        except EOFError:
            return None
    line = source.readline()
    return None if line == "" else line.rstrip("\n")


def chat_loop(
    model,
    tokenizer,
    system: str | None,
    max_new_tokens: int,
    temperature: float = 0.0,
    source: TextIO | None = None,
    sink: TextIO | None = None,
) -> list[dict]:
    """Read user lines until /exit or end of input; returns the conversation."""
    source, sink = source or sys.stdin, sink or sys.stdout
    interactive = source.isatty()
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    while (line := _read_line(source, interactive)) is not None:
        text = line.strip()
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages = list(start)
            print("(conversation cleared)", file=sink, flush=True)
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        print("assistant> ", end="", file=sink, flush=True)
        reply = ""
        for piece in stream_reply(model, tokenizer, messages, max_new_tokens, temperature):
            reply += piece
            print(piece, end="", file=sink, flush=True)
        print(file=sink, flush=True)
        messages.append({"role": "assistant", "content": reply.strip()})
    return messages


def run_chat(
    run: str, system: str | None, checkpoint: int | None, max_new_tokens: int = 256, temperature: float = 0.0
) -> int:
    weights = locate_weights(run, checkpoint)
    model, tokenizer = load_for_generation(weights)
    which = f"checkpoint step {checkpoint}" if checkpoint is not None else "final weights"
    print(f"chatting with {run} ({which}); /reset starts over, /exit quits", file=sys.stderr)
    if system is None and (system := team_system_of(run)):  # the context the team's voice was trained in
        print(f"system message: the team's, as trained (--system TEXT replaces it): {system}", file=sys.stderr)
    chat_loop(model, tokenizer, system, max_new_tokens, temperature)
    return 0
