"""The job service answers chat completions for a job it trained: SDK upload -> job -> worker -> chat."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch
from ship_server import serving

from finetune.data.prompting import prompt_ids, stop_ids
from finetune.ship.run_folder import load_for_generation, locate_weights

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
QUESTION = [{"role": "user", "content": "Hi, my parcel has not arrived yet. Can you check?"}]


def _greedy_text(model, tokenizer, max_new_tokens: int) -> str:
    ids = torch.tensor([prompt_ids(tokenizer, QUESTION)])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture(scope="module")
def service(toy_model, tmp_path_factory):
    from finetune.service.dashboard.app import create_app
    from finetune.service.options import ServiceOptions
    from finetune.service.storage.store import Store

    settings = ServiceOptions(data_dir=tmp_path_factory.mktemp("service"), models={"toy": str(toy_model)})
    store = Store(settings.database_url)
    app = create_app(settings, store)
    keys = {tenant: store.create_key(tenant)[1] for tenant in ("acme", "other")}
    with serving(app) as url:
        clients = {t: openai.OpenAI(base_url=f"{url}/v1", api_key=k, max_retries=0) for t, k in keys.items()}
        yield settings, store, clients


def test_a_succeeded_job_answers_through_the_sdk(service):
    from finetune.service.workers.worker import Worker

    settings, store, clients = service
    acme, other = clients["acme"], clients["other"]
    with (EXAMPLES / "train.jsonl").open("rb") as data:
        uploaded = acme.files.create(file=data, purpose="fine-tune")
    hyper = {
        "n_epochs": 1,
        "batch_size": 8,
        "max_steps": 4,
        "max_seq_len": 512,
        "eval_every": 2,
        "learning_rate_multiplier": 20,
    }
    job = acme.fine_tuning.jobs.create(
        model="toy",
        training_file=uploaded.id,
        suffix="support",
        method={"type": "supervised", "supervised": {"hyperparameters": hyper}},
    )
    worker = Worker(settings, store, poll_seconds=0.1)
    while worker.run_once():
        pass
    job = acme.fine_tuning.jobs.retrieve(job.id)
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model

    model, tokenizer = load_for_generation(locate_weights(settings.runs_dir / job.id))
    expected = _greedy_text(model, tokenizer, 10)
    answer = acme.chat.completions.create(model=job.fine_tuned_model, messages=QUESTION, max_tokens=10, temperature=0)
    assert answer.choices[0].message.content == expected
    assert answer.usage.prompt_tokens == len(prompt_ids(tokenizer, QUESTION))
    stream = acme.chat.completions.create(
        model=job.fine_tuned_model, messages=QUESTION, max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected

    checkpoints = acme.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoints
    name = checkpoints[-1].fine_tuned_model_checkpoint
    step = checkpoints[-1].step_number
    at_step, _ = load_for_generation(locate_weights(settings.runs_dir / job.id, step))
    got = acme.chat.completions.create(model=name, messages=QUESTION, max_tokens=10, temperature=0)
    assert got.choices[0].message.content == _greedy_text(at_step, tokenizer, 10)

    base = acme.chat.completions.create(model="toy", messages=QUESTION, max_tokens=10, temperature=0)
    assert base.choices[0].message.content != expected  # the tuned model is not the base

    for missing in (job.fine_tuned_model, name):  # another tenant's model is not there for them
        with pytest.raises(openai.NotFoundError):
            other.chat.completions.create(model=missing, messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        acme.chat.completions.create(model=f"{job.fine_tuned_model}:ckpt-step-999", messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=acme.base_url, api_key="wrong", max_retries=0).chat.completions.create(
            model="toy", messages=QUESTION, max_tokens=2
        )
