"""The decoder's key/value cache: allocated once per batch, never grown, shrunk in place as rows finish.

    cache = BatchCache(rows=32, capacity=prompt_width + max_new_tokens)
    model(..., past_key_values=cache, use_cache=True)   # every layer writes its keys and values into its buffers
    cache.keep(rows_left, drop_front=columns)           # finished rows and the padding only they needed leave

transformers' DynamicCache concatenates every step (each layer's keys and values copied whole, every token);
its StaticCache is allocated once, but attends over its whole capacity at every step and keeps its batch. Here each
layer allocates its buffers at its first write (their heads, width, dtype and device are the model's), writes each
step's keys in place, and hands attention the filled columns only; the rows that remain are moved to the front of
the same buffers, and the left padding no remaining row needs is skipped.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _Layer(DynamicLayer):
    """One attention layer's keys and values: [rows, heads, capacity, width] buffers, the filled columns a view."""

    def __init__(self, rows: int, capacity: int) -> None:
        super().__init__()
        self.rows, self.capacity, self.start, self.end = rows, capacity, 0, 0
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        heads = key_states.shape[1]
        self.key_buffer = key_states.new_empty((self.rows, heads, self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((self.rows, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, new = key_states.shape[0], key_states.shape[-2]
        if self.end + new > self.capacity:
            raise RuntimeError(f"the key/value cache holds {self.capacity} positions; {self.end + new} were asked")
        self.key_buffer[:rows, :, self.end : self.end + new] = key_states
        self.value_buffer[:rows, :, self.end : self.end + new] = value_states
        self.end += new
        self.keys = self.key_buffer[:rows, :, self.start : self.end]
        self.values = self.value_buffer[:rows, :, self.start : self.end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.end - self.start

    def keep(self, rows: torch.Tensor, drop_front: int) -> None:
        """Only `rows` (indices, ascending) stay, moved to the front; `drop_front` more leading columns are skipped."""
        if self.is_initialized:
            span = slice(self.start, self.end)
            for buffer in (self.key_buffer, self.value_buffer):
                buffer[: len(rows), :, span] = buffer[rows, :, span]  # gathered first, then written: no overlap issue
        self.start += drop_front
        if self.is_initialized:
            self.keys = self.key_buffer[: len(rows), :, self.start : self.end]
            self.values = self.value_buffer[: len(rows), :, self.start : self.end]


class BatchCache(Cache):
    """A cache of one batch for every layer of the model (each layer allocated at its first write)."""

    def __init__(self, rows: int, capacity: int) -> None:
        super().__init__(layer_class_to_replicate=lambda: _Layer(rows, capacity))

    def keep(self, rows: torch.Tensor, drop_front: int = 0) -> None:
        for layer in self.layers:
            layer.keep(rows, drop_front)


def plain_attention_layers(config) -> bool:
    """Whether every layer of the model attends to the whole past (no sliding window, no linear or state layers):
    the models BatchCache serves; the others decode with transformers' own DynamicCache."""
    text = config.get_text_config(decoder=True)
    types = set(getattr(text, "layer_types", None) or ["full_attention"])
    return types == {"full_attention"} and not getattr(text, "sliding_window", None)
