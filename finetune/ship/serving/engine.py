"""The serving engine: load models lazily, share a base among its adapters, evict the least recently used.

    engine = Engine(max_models=4)
    done = engine.complete(ModelLocation(base="/models/base", adapter="/runs/one/adapter"), messages, params)
    for piece in engine.stream(location, messages, params): ...   # str pieces, then one Completion

Memory: a base model is loaded once; every LoRA adapter trained on it is attached to that one copy
(PEFT multi-adapter: `load_adapter` / `set_adapter`, `disable_adapter` for the base alone). A loaded
base counts as one model and each attached adapter as one more; past `max_models` the least recently
used adapter is detached, and a base whose adapters are all gone and that was not used alone
recently is dropped. Generation holds one lock: a model's active adapter is global state, and two
generations on the CPU would only slow each other down.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from finetune.data.prompting import prompt_ids, stop_ids
from finetune.data.tokenize import load_tokenizer
from finetune.placement.decode import Sampling, decode, stops_of
from finetune.placement.load import device_of, load_placed
from finetune.placement.where import Placement, for_model


@dataclass(frozen=True)
class ModelLocation:
    """Where a servable model is: a base (or full) model folder, and optionally a LoRA adapter on it."""

    base: str
    adapter: str | None = None
    system: str | None = None  # the run's team system message: put first on a request without one (router.py)


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int | None = None  # None: the engine's default
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" (end of turn or a stop string) | "length"
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Base:
    model: object  # the base model, or a PeftModel wrapping it once an adapter is attached
    tokenizer: object
    adapters: dict[str, str] = field(default_factory=dict)  # adapter folder -> PEFT adapter name


Key = tuple[str, str | None]


class Engine:
    def __init__(
        self,
        max_models: int = 4,
        default_max_tokens: int = 256,
        dtype: str = "auto",
        device: str | None = None,
    ):
        """`dtype` ("auto", "fp32", "bf16") and `device` (None: a GPU when there is one): where each base is placed
        (placement/where.for_model: Auto's rule for the model on this machine, as a run of it would choose)."""
        if max_models < 1:
            raise ValueError("max_models must be at least 1")
        self.max_models = max_models
        self.default_max_tokens = default_max_tokens
        self.dtype, self.device = dtype, device
        self._bases: dict[str, _Base] = {}
        self._used: OrderedDict[Key, None] = OrderedDict()  # least recently used first
        self._names = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ what is loaded

    def loaded(self) -> list[Key]:
        """(base, adapter) pairs in memory, the base alone as (base, None); for tests and introspection."""
        with self._lock:
            return [(b, None) for b in self._bases] + [(b, a) for b, e in self._bases.items() for a in e.adapters]

    def _size(self) -> int:
        return len(self._bases) + sum(len(e.adapters) for e in self._bases.values())

    def _load_base(self, base: str) -> _Base:
        if base not in self._bases:
            tokenizer = load_tokenizer(base)  # with ChatML added to a base without a template: the model grows to it
            model = load_placed(base, self.placement(base), vocab_size=len(tokenizer))
            model.eval()
            self._bases[base] = _Base(model, tokenizer)
        return self._bases[base]

    def placement(self, base: str) -> Placement:
        """The device and precision `base` (and every adapter on it) is served in."""
        return for_model(base, self.dtype, self.device)

    def _attach(self, entry: _Base, adapter: str) -> str:
        from peft import PeftModel

        if adapter not in entry.adapters:
            self._names += 1
            name = f"adapter{self._names}"
            # the adapter's weights go where the base is, in its precision (placement/load.py, load_adapted)
            where = {"torch_device": device_of(entry.model), "autocast_adapter_dtype": False}
            if isinstance(entry.model, PeftModel):
                entry.model.load_adapter(adapter, adapter_name=name, **where)
            else:
                entry.model = PeftModel.from_pretrained(entry.model, adapter, adapter_name=name, **where)
            entry.model.eval()
            entry.adapters[adapter] = name
        return entry.adapters[adapter]

    def _detach(self, base: str, adapter: str) -> None:
        entry = self._bases[base]
        name = entry.adapters.pop(adapter)
        if entry.adapters:
            with warnings.catch_warnings():  # "was active, now deleted": the next request sets its own
                warnings.simplefilter("ignore", UserWarning)
                entry.model.delete_adapter(name)
        else:  # the last adapter: take the LoRA layers out, keep the plain base
            entry.model = entry.model.unload()

    def _evict(self, keep: Key) -> None:
        for key in list(self._used):
            if self._size() <= self.max_models:
                return
            base, adapter = key
            if key == keep or base not in self._bases:
                continue
            del self._used[key]
            if adapter is not None:
                self._detach(base, adapter)
            used_alone = (base, None) in self._used
            if not self._bases[base].adapters and not used_alone and base != keep[0]:
                del self._bases[base]

    def _select(self, location: ModelLocation) -> tuple[_Base, str | None]:
        """Load what the location needs, mark it used, evict past the limit; the base entry and adapter name."""
        key = (location.base, location.adapter)
        entry = self._load_base(location.base)
        name = self._attach(entry, location.adapter) if location.adapter else None
        self._used[key] = None
        self._used.move_to_end(key)
        self._evict(keep=key)
        return entry, name

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def _run(self, location: ModelLocation, messages: list[dict], params: GenerationParams, on_token=None):
        """Generate under the lock with the product's one decoder (placement/decode.py); returns (new token ids,
        prompt length, tokenizer). `on_token(row, token)` sees each token as it is picked (a stream)."""
        with self._lock:
            entry, name = self._select(location)
            tokenizer, model = entry.tokenizer, entry.model
            ids = prompt_ids(tokenizer, messages)
            if params.seed is not None:
                torch.manual_seed(params.seed)
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            stop_when = _StopText(tokenizer, params.stop) if params.stop else None
            sampling = Sampling(params.temperature, params.top_p)
            with _adapter_chosen(model, name, bool(entry.adapters)):
                new = decode(model, [ids], pad_id, stops_of(model, tokenizer), params.max_tokens or
                             self.default_max_tokens, sampling, on_token, stop_when)[0]  # fmt: skip
            return new, len(ids), tokenizer

    def tokenizer_for(self, location: ModelLocation):
        with self._lock:
            return self._load_base(location.base).tokenizer

    def complete(self, location: ModelLocation, messages: list[dict], params: GenerationParams) -> Completion:
        new, prompt_len, tokenizer = self._run(location, messages, params)
        text = tokenizer.decode(new, skip_special_tokens=True)
        return _finish(text, new, prompt_len, tokenizer, params, self.default_max_tokens)

    def stream(self, location: ModelLocation, messages: list[dict], params: GenerationParams) -> Iterator:
        """Text pieces as they are generated (stop strings held back and never sent), then one Completion."""
        from transformers import TextIteratorStreamer

        tokenizer = self.tokenizer_for(location)
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=False, skip_special_tokens=True, timeout=600)
        result: dict = {}

        def work() -> None:
            try:
                result["out"] = self._run(location, messages, params, lambda _, t: streamer.put(torch.tensor([t])))
                streamer.end()
            except BaseException as exc:  # surfaced to the reader below, after the streamer is released
                result["error"] = exc
                streamer.end()

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        text, sent = "", 0
        holdback = max((len(s) for s in params.stop), default=1) - 1
        for piece in streamer:
            text += piece
            cut = _first_stop(text, params.stop)
            limit = cut if cut is not None else len(text) - holdback
            if limit > sent:
                yield text[sent:limit]
                sent = limit
        worker.join()
        if "error" in result:
            raise result["error"]
        new, prompt_len, _ = result["out"]
        text = tokenizer.decode(new, skip_special_tokens=True)
        done = _finish(text, new, prompt_len, tokenizer, params, self.default_max_tokens)
        if len(done.text) > sent:
            yield done.text[sent:]
        yield done


class _StopText:
    """Stop once the generated text (not the prompt: OpenAI's `stop` never matches it) holds a stop string."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.tokenizer, self.stops = tokenizer, stops
        self.window = max(len(s) for s in stops) + 2  # a stop string spans at most this many tokens

    def __call__(self, row: int, written: list[int]) -> bool:
        text = self.tokenizer.decode(written[-self.window :], skip_special_tokens=True)
        return _first_stop(text, self.stops) is not None


def _adapter_chosen(model, name: str | None, has_adapters: bool):
    """The adapter `name` active, or (None) the base alone: its adapters switched off while inside."""
    if name is not None:
        model.set_adapter(name)
    elif has_adapters:
        return model.disable_adapter()
    return contextlib.nullcontext()


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def _finish(
    text: str, new: list[int], prompt_len: int, tokenizer, params: GenerationParams, default_max: int
) -> Completion:
    cut = _first_stop(text, params.stop)
    if cut is not None:
        return Completion(text[:cut], "stop", prompt_len, len(new))
    ended = bool(new) and new[-1] in stop_ids(tokenizer)
    limit = params.max_tokens or default_max
    reason = "length" if not ended and len(new) >= limit else "stop"
    return Completion(text, reason, prompt_len, len(new))
