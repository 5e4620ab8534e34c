"""`finetune chat RUN [--system TEXT] [--checkpoint STEP]`: talk to the tuned model in the terminal.

Multi-turn: each answer joins the conversation, and the whole conversation is rendered with the chat
template exactly as training rendered it (finetune/data/prompting.py). Tokens are printed as they are
generated. One message per line; `/reset` starts over, `/exit` (or end of input) quits, so a
conversation can also be piped in: `printf 'hi\\nthanks\\n' | finetune chat runs/one`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TextIO

from finetune.data.prompting import prompt_ids
from finetune.placement.decode import Sampling
from finetune.placement.stream import Streamed
from finetune.ship.run_folder import load_for_generation, locate_weights, team_system_of


def stream_reply(
    model, tokenizer, messages: list[dict], max_new_tokens: int, temperature: float = 0.0
) -> Iterator[str]:
    """The model's next reply, piece by piece as tokens arrive (the product's one decoder: placement/decode.py)."""
    yield from Streamed(model, tokenizer, prompt_ids(tokenizer, messages), max_new_tokens, Sampling(temperature))


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
