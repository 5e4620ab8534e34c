"""The serving engine and `POST /v1/chat/completions`, called through the official openai SDK."""

from __future__ import annotations

import pytest
import torch
from ship_server import serving

from finetune.data.prompting import prompt_ids, stop_ids
from finetune.ship.run_folder import load_for_generation, locate_weights
from finetune.ship.serving import Engine, GenerationParams, ModelLocation, ModelNotFound, chat_completions_router

QUESTION = [{"role": "user", "content": "Hello, can I get a refund for my order?"}]


def _greedy_ids(model, tokenizer, messages, max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt_ids(tokenizer, messages)])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def locations(lora_run, toy_model):
    tuned = locate_weights(lora_run)
    step3 = locate_weights(lora_run, checkpoint=3)
    return {
        "base": ModelLocation(str(toy_model)),
        "tuned": ModelLocation(tuned.base, str(tuned.adapter)),
        "step3": ModelLocation(step3.base, str(step3.adapter)),
    }


@pytest.fixture(scope="module")
def client(locations):
    from fastapi import FastAPI, Header
    from openai import OpenAI

    owners = {"ft:toy:acme": ("acme", "tuned"), "ft:toy:acme:ckpt-step-3": ("acme", "step3"), "toy": (None, "base")}

    def tenant(authorization: str = Header("")) -> str:
        return authorization.removeprefix("Bearer ")

    def resolver(name: str, caller: str):
        owner, which = owners.get(name, ("", ""))
        if owner is None or owner == caller:
            return locations[which]
        raise ModelNotFound(name)

    app = FastAPI()
    app.include_router(chat_completions_router(resolver, Engine(max_models=3, default_max_tokens=12), tenant=tenant))
    with serving(app) as url:
        yield (
            OpenAI(base_url=f"{url}/v1", api_key="acme", max_retries=0),
            OpenAI(base_url=f"{url}/v1", api_key="other", max_retries=0),
        )


def test_sdk_answers_like_the_tuned_model_streamed_and_not(client, lora_run):
    acme, _ = client
    model, tokenizer = load_for_generation(locate_weights(lora_run))
    expected_ids = _greedy_ids(model, tokenizer, QUESTION, 10)
    expected = tokenizer.decode(expected_ids, skip_special_tokens=True)

    done = acme.chat.completions.create(model="ft:toy:acme", messages=QUESTION, max_tokens=10, temperature=0)
    assert done.choices[0].message.content == expected and done.choices[0].message.role == "assistant"
    assert done.usage.prompt_tokens == len(prompt_ids(tokenizer, QUESTION))
    assert done.usage.completion_tokens == len(expected_ids)
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    ended = expected_ids[-1] in stop_ids(tokenizer)
    assert done.choices[0].finish_reason == ("stop" if ended else "length")

    chunks = list(
        acme.chat.completions.create(
            model="ft:toy:acme",
            messages=QUESTION,
            max_completion_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # it did stream
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == done.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected_ids) and chunks[-1].choices == []


def test_base_checkpoint_and_stop(client, locations, toy_model):
    acme, _ = client
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, tokenizer = AutoModelForCausalLM.from_pretrained(toy_model), AutoTokenizer.from_pretrained(toy_model)
    expected = tokenizer.decode(_greedy_ids(base, tokenizer, QUESTION, 8), skip_special_tokens=True)
    got = acme.chat.completions.create(model="toy", messages=QUESTION, max_tokens=8, temperature=0)
    assert got.choices[0].message.content == expected

    step3 = (
        acme.chat.completions.create(model="ft:toy:acme:ckpt-step-3", messages=QUESTION, max_tokens=8, temperature=0)
        .choices[0]
        .message.content
    )
    tuned = (
        acme.chat.completions.create(model="ft:toy:acme", messages=QUESTION, max_tokens=8, temperature=0)
        .choices[0]
        .message.content
    )
    assert len({expected, step3, tuned}) > 1  # three models, one base in memory

    full = acme.chat.completions.create(model="ft:toy:acme", messages=QUESTION, max_tokens=12, temperature=0)
    text = full.choices[0].message.content
    assert len(text) > 4  # stop at a piece of the answer: the text before it, and finish_reason "stop"
    stop = text[2:4]
    cut = acme.chat.completions.create(
        model="ft:toy:acme", messages=QUESTION, max_tokens=12, temperature=0, stop=[stop]
    )
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = acme.chat.completions.create(
        model="ft:toy:acme", messages=QUESTION, max_tokens=12, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text[: text.index(stop)]


def test_sampling_is_reproducible_with_a_seed(client):
    acme, _ = client
    ask = dict(model="ft:toy:acme", messages=QUESTION, max_tokens=10, temperature=1.5, top_p=0.95)
    first = acme.chat.completions.create(seed=7, **ask).choices[0].message.content
    again = acme.chat.completions.create(seed=7, **ask).choices[0].message.content
    assert first == again


def test_unknown_and_other_tenants_models_are_404(client):
    import openai

    acme, other = client
    for caller, name in ((other, "ft:toy:acme"), (acme, "ft:toy:nobody"), (other, "ft:toy:acme:ckpt-step-3")):
        with pytest.raises(openai.NotFoundError) as caught:
            caller.chat.completions.create(model=name, messages=QUESTION, max_tokens=2)
        assert caught.value.body["code"] == "model_not_found" and name in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        acme.chat.completions.create(model="toy", messages=[], max_tokens=2)


def test_engine_shares_the_base_and_evicts_the_least_recently_used(locations):
    engine = Engine(max_models=2, default_max_tokens=2)
    greedy = GenerationParams(temperature=0)
    engine.complete(locations["tuned"], QUESTION, greedy)
    assert engine.loaded() == [(locations["base"].base, None), (locations["base"].base, locations["tuned"].adapter)]
    engine.complete(locations["step3"], QUESTION, greedy)  # same base: one base + 2 adapters > 2: tuned goes
    assert engine.loaded() == [(locations["base"].base, None), (locations["base"].base, locations["step3"].adapter)]
    engine.complete(locations["tuned"], QUESTION, greedy)
    assert engine.loaded() == [(locations["base"].base, None), (locations["base"].base, locations["tuned"].adapter)]
    # the tuned answer after eviction and reload equals a fresh engine's
    again = engine.complete(locations["tuned"], QUESTION, GenerationParams(temperature=0, max_tokens=6)).text
    fresh = Engine().complete(locations["tuned"], QUESTION, GenerationParams(temperature=0, max_tokens=6)).text
    assert again == fresh


def test_raw_stream_is_openai_server_sent_events(client):
    """What the SDK hides: each event a `data: ` line of a chat.completion.chunk, the last one `data: [DONE]`."""
    import json
    import urllib.request

    acme, _ = client
    body = {"model": "ft:toy:acme", "messages": QUESTION, "max_tokens": 6, "temperature": 0, "stream": True}
    request = urllib.request.Request(
        f"{acme.base_url}chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer acme", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.decode().rstrip("\n") for line in response if line.strip()]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_a_failed_generation_is_an_openai_error(locations):
    import openai
    from fastapi import FastAPI
    from openai import OpenAI

    class Failing(Engine):
        def complete(self, location, messages, params):
            raise RuntimeError("CUDA out of memory")

        def stream(self, location, messages, params):
            raise RuntimeError("CUDA out of memory")
            yield  # a generator, like Engine.stream

    app = FastAPI()
    app.include_router(chat_completions_router(lambda name, caller: locations["base"], Failing()))
    with serving(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="any", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="toy", messages=QUESTION, max_tokens=2)
        assert caught.value.body["type"] == "server_error" and "CUDA out of memory" in caught.value.body["message"]
        with pytest.raises(openai.APIError, match="CUDA out of memory"):
            list(client.chat.completions.create(model="toy", messages=QUESTION, max_tokens=2, stream=True))
