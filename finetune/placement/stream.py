"""One prompt decoded on a thread of its own, its text handed over as it is written: `finetune chat` and the serving
engine's streams, through the one decoder (decode.py).

    streamed = Streamed(model, tokenizer, ids, max_new_tokens=256, sampling=Sampling(0.7))
    for piece in streamed: ...          # text pieces as tokens arrive
    streamed.new_ids                    # every new token, once the pieces end (its failure is raised there)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import torch

from finetune.placement.decode import GREEDY, Sampling, decode, stops_of


class Streamed:
    """The reply to one prompt: iterate for its text pieces (decoded by transformers' streamer)."""

    def __init__(
        self, model, tokenizer, ids: list[int], max_new_tokens: int, sampling: Sampling = GREEDY,
        stop_when: Callable[[int, list[int]], bool] | None = None, timeout: float | None = None,
    ) -> None:  # fmt: skip
        from transformers import TextIteratorStreamer

        self.streamer = TextIteratorStreamer(tokenizer, skip_prompt=False, skip_special_tokens=True, timeout=timeout)
        self.new_ids: list[int] = []
        self._failure: list[BaseException] = []
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        stops = stops_of(model, tokenizer)

        def work() -> None:
            try:
                self.new_ids = decode(model, [ids], pad_id, stops, max_new_tokens, sampling, self._put, stop_when)[0]
            except BaseException as exc:  # raised in the reader's thread: a failure must not leave it waiting
                self._failure.append(exc)
            finally:
                self.streamer.end()

        self._worker = threading.Thread(target=work, daemon=True)
        self._worker.start()

    def _put(self, row: int, token: int) -> None:
        self.streamer.put(torch.tensor([token]))

    def __iter__(self) -> Iterator[str]:
        yield from self.streamer
        self._worker.join()
        if self._failure:
            raise self._failure[0]
