"""Auto's rules: values within practice, monotone where practice says so, every choice with its reason."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from finetune.plan.build import build_plan
from finetune.plan.what_if import what_if_summary
from finetune.rules import auto
from finetune.settings.config import RunConfig
from finetune.settings.wording import render

records = st.integers(1, 2_000_000)
tokens = st.integers(0, 10**9)


@pytest.fixture
def toy_base_facts():
    """The pretrained toy base's shape (finetune.ship.toy.BASE_SIZE), untied, without building it."""
    from finetune.rules.model_facts import from_config

    return from_config(
        {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 344, "vocab_size": 2048, "tie_word_embeddings": False},
        "toy-base", "test",
    )  # fmt: skip


def make(examples: int, tokens: int | None = None, model_facts=None, **settings):
    config = RunConfig(**settings)
    return build_plan(config, what_if_summary(config, examples, tokens), model_facts)


# ----------------------------------------------------------------------------- epochs


@pytest.mark.parametrize(("n", "epochs"), [(1, 4), (40, 4), (99, 4), (100, 3), (800, 3), (5_000, 2), (50_000, 1)])
def test_epochs_by_data_size(n, epochs):
    assert auto.auto_epochs(n).value == epochs


@given(a=records, b=records)
def test_more_data_never_means_more_epochs(a, b):
    small, large = sorted((a, b))
    assert auto.auto_epochs(large).value <= auto.auto_epochs(small).value
    assert 1 <= auto.auto_epochs(large).value <= 4


@given(n=records, a=tokens, b=tokens)
def test_more_tokens_never_means_more_epochs(n, a, b):
    small, large = sorted((a, b))
    assert auto.auto_epochs(n, large).value <= auto.auto_epochs(n, small).value


def test_epochs_are_never_raised_far_for_tiny_data():
    assert auto.auto_epochs(5).value <= 4  # OpenAI's rule would give 100 // 5 = 20


# ----------------------------------------------------------------------------- batch


@given(n=records, epochs=st.integers(1, 4))
def test_effective_batch_within_practice(n, epochs):
    e = auto.auto_effective_batch(n, epochs).value
    assert 1 <= e <= auto.MAX_EFFECTIVE_BATCH
    assert e <= n
    if n >= auto.MIN_EFFECTIVE_BATCH:
        assert e >= auto.MIN_EFFECTIVE_BATCH


@given(a=records, b=records)
def test_more_data_never_means_a_smaller_auto_batch(a, b):
    small, large = sorted((a, b))
    e_small = auto.auto_effective_batch(small, auto.auto_epochs(small).value).value
    e_large = auto.auto_effective_batch(large, auto.auto_epochs(large).value).value
    assert e_large >= e_small


def test_small_data_gets_a_smaller_batch_not_more_epochs():
    plan = make(100)
    assert plan.epochs == 3 and plan.effective_batch == 4 and plan.total_steps == 75
    assert "halved" in plan.auto["batch_size"]
    plan = make(800)
    assert plan.effective_batch == 8 and plan.total_steps == 300


def test_auto_batch_splits_over_accumulation_and_devices():
    assert auto.auto_batch_size(800, 3, grad_accum=8, devices=1).value == 1
    assert auto.auto_batch_size(20_000, 1, grad_accum=2, devices=2).value == 8


def test_auto_batch_shrinks_to_fit_memory():
    choice = auto.auto_batch_size(800, 3, 1, 1, fits=lambda b: b <= 2, device_name="l4-24gb")
    assert choice.value == 2 and "l4-24gb" in choice.reason and "--grad-accum" in render(choice.reason)


# ----------------------------------------------------------------------------- learning rate


@given(effective=st.integers(1, 4096), hidden=st.one_of(st.none(), st.integers(64, 16384)))
def test_lora_lr_is_ten_times_full_times_the_steeper_width_factor(effective, hidden):
    lora = auto.auto_lr("lora", effective, hidden).value
    full = auto.auto_lr("full", effective, hidden).value
    assert lora > full
    steeper = 1 if hidden is None else min(32, max(0.5, (4096 / hidden) ** 1.5)) / min(32, max(0.5, 4096 / hidden))
    assert math.isclose(lora / full, 10 * steeper, rel_tol=0.1)  # each rounded to two digits: up to 5% apiece


@given(a=st.integers(1, 4096), b=st.integers(1, 4096))
def test_lr_grows_with_the_batch(a, b):
    small, large = sorted((a, b))
    assert auto.auto_lr("lora", large).value >= auto.auto_lr("lora", small).value


@given(a=st.integers(64, 16384), b=st.integers(64, 16384))
def test_wider_models_never_get_a_larger_lr(a, b):
    narrow, wide = sorted((a, b))
    assert auto.auto_lr("lora", 16, wide).value <= auto.auto_lr("lora", 16, narrow).value


def test_reference_rates():
    assert auto.auto_lr("lora", 16, 4096).value == 2e-4
    assert auto.auto_lr("full", 16, 4096).value == 2e-5
    assert auto.auto_lr("lora", 64, 4096).value == 4e-4  # sqrt(64 / 16) = 2


def test_narrow_models_scale_the_rate_with_one_over_width_and_lora_more_steeply():
    assert auto.auto_lr("full", 16, 1024).value == 8e-5  # 4096 / 1024 = 4
    assert auto.auto_lr("lora", 16, 1024).value == 1.6e-3  # (4096 / 1024)^1.5 = 8
    assert auto.auto_lr("full", 8, 576).value == 1e-4  # SmolLM2: its best full rate in the sweep (bench/AUTO.md)
    assert auto.auto_lr("lora", 4, 576, 75).value == 2.2e-3  # SmolLM2, 100 records: x 19.0, x 0.5, x 1.15
    assert auto.auto_lr("lora", 8, 128).value == 4.5e-3  # the toy base: x 32 (the cap), x sqrt(8 / 16)
    assert auto.auto_lr("full", 8, 128).value == 4.5e-4
    assert auto.auto_lr("lora", 16, 64).value == auto.auto_lr("lora", 16, 128).value  # capped at 32
    assert auto.auto_lr("lora", 16, 16384).value == 1e-4  # wider than 4096: at most halved
    assert "(4096/576)^1.5, at most 32" in auto.auto_lr("lora", 16, 576).reason


def test_lr_follows_the_users_batch():
    plan = make(800, batch_size=32)
    assert plan.learning_rate == auto.auto_lr("lora", 32, None, plan.total_steps).value
    assert plan.learning_rate > make(800).learning_rate


def test_a_run_shorter_than_100_steps_takes_larger_steps_at_most_twice():
    assert auto.auto_lr("lora", 4, 128, 40).value == 5.1e-3  # the toy base on 40 records: 3.2e-3 x sqrt(100/40)
    assert auto.auto_lr("lora", 4, 128, 100).value == auto.auto_lr("lora", 4, 128).value == 3.2e-3
    assert auto.auto_lr("lora", 16, None, 4).value == 2 * auto.auto_lr("lora", 16).value  # capped at x 2
    choice = make(40, model_facts=None)  # 40 records: batch 4 x 4 epochs = 40 steps, under Auto's 100
    assert choice.total_steps == 40 and "short run (40 steps" in choice.auto["learning_rate"]
    assert "short run" not in make(800).auto["learning_rate"]  # 800 records: 100 steps at batch 8


# ----------------------------------------------------------------------------- LoRA rank, warmup, evaluation


@given(n=records, a=tokens, b=tokens)
def test_rank_grows_with_tokens(n, a, b):
    small, large = sorted((a, b))
    r_small, r_large = auto.auto_lora_rank(n, small).value, auto.auto_lora_rank(n, large).value
    assert r_small <= r_large and {r_small, r_large} <= {8, 16, 32, 64}


@given(n=records, a=tokens, per_rank=st.integers(1_000, 5_000_000))
def test_rank_never_falls_below_the_token_table_and_stays_at_most_64(n, a, per_rank):
    by_tokens = auto.auto_lora_rank(n, a).value
    assert by_tokens <= auto.auto_lora_rank(n, a, per_rank).value <= 64


def test_a_small_model_gets_a_rank_with_ten_weights_per_token():
    choice = auto.auto_lora_rank(330, 51_374, 9_248)  # the toy base on the bundled examples
    assert choice.value == 64 and "not 8" in choice.reason and 64 * 9_248 >= 10 * 51_374
    assert auto.auto_lora_rank(330, 51_374, 2_600_000).value == 8  # an 8B model: the table's rank
    assert auto.auto_lora_rank(10_000, 5_000_000, 2_600_000).value == 32  # 16 holds 42M < 50M weights
    assert "the most Auto picks" in auto.auto_lora_rank(330, 10_000_000, 9_248).reason


def test_rank_without_tokens_is_guessed_and_says_so():
    choice = auto.auto_lora_rank(100_000, None)
    assert choice.value == 32 and "guessed" in choice.reason


# ----------------------------------------------------------------------------- LoRA: the output layer


def test_a_small_models_output_layer_is_trained_beside_the_adapter():
    from finetune.models.facts import load_model_facts

    choice = auto.auto_lora_train_head(262_144, 1_250_432, tied=False)  # the toy base: 21%
    assert choice.value is True and "21%" in choice.reason
    for name in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B", "mistralai/Mistral-7B-v0.3"):  # 2-7%: adapter only
        facts = load_model_facts(name)
        decided = auto.auto_lora_train_head(facts.head_params, facts.total_params, facts.tie_word_embeddings)
        assert decided.value is False and "adapter only" in decided.reason
    tied = load_model_facts("Qwen/Qwen2.5-0.5B")  # its output layer is its embedding
    assert auto.auto_lora_train_head(tied.head_params, tied.total_params, tied.tie_word_embeddings).value is False
    assert auto.auto_lora_train_head(262_144, 1_250_432, False, preference=True).value is False
    assert auto.auto_lora_train_head(None, None, None).value is False


def test_the_plan_says_whether_lora_trains_the_output_layer(toy_base_facts):
    lora = make(330, 51_374, toy_base_facts)
    assert lora.lora_train_head is True and "lora_train_head" in lora.auto
    assert make(330, 51_374, toy_base_facts, lora_train_head=False).lora_train_head is False
    full = make(330, 51_374, toy_base_facts, method="full")
    assert full.lora_train_head is None
    with_head = lora.memory.trainable_parameters
    without = make(330, 51_374, toy_base_facts, lora_train_head=False).memory.trainable_parameters
    assert with_head - without == toy_base_facts.head_params


def test_training_a_tied_output_layer_is_refused_at_plan_time(toy_base_facts):
    import dataclasses

    from finetune.settings.errors import UserError

    tied = dataclasses.replace(toy_base_facts, tie_word_embeddings=True)
    assert make(330, 51_374, tied).lora_train_head is False  # Auto: the adapter only
    with pytest.raises(UserError, match="tied to its input embeddings; use --lora-train-head off"):
        make(330, 51_374, tied, lora_train_head=True)


def test_lora_alpha_is_twice_the_rank():
    assert auto.auto_lora_alpha(16).value == 32


def test_warmup_is_a_ratio():
    plan = make(800, epochs=3, batch_size=8)
    assert plan.warmup_steps == 15 and plan.warmup_ratio == 0.05 and "warmup_steps" in plan.auto
    plan = make(8000, epochs=3, batch_size=8)
    assert plan.warmup_steps == round(0.05 * plan.total_steps)


@pytest.mark.parametrize("total", [1, 5, 9, 10, 39, 300, 12_345])
def test_about_ten_evaluations(total):
    every = auto.auto_eval_every(total, True).value
    assert every >= 1 and total // every <= 10
    assert total < 10 or total // every >= 9


def test_save_every_follows_eval_every():
    plan = make(800)
    assert plan.save_every == plan.eval_every == 30


# ----------------------------------------------------------------------------- reasons


def test_every_auto_value_has_a_reason_and_user_values_have_none():
    plan = make(800, 400_000)
    for field in ("epochs", "batch_size", "learning_rate", "lora_rank", "lora_alpha", "warmup_steps", "eval_every",
                  "save_every", "gradient_checkpointing", "shard", "val_fraction", "max_seq_len"):  # fmt: skip
        assert plan.auto[field], field
    data = plan.to_dict()
    assert set(data["auto"]) <= set(data)  # every key names a field of the plan
    plan = make(800, epochs=2, batch_size=8, lr=1e-4, lora_rank=16, eval_every=10, warmup_ratio=0.1, max_seq_len=512)
    assert not {
        "epochs",
        "batch_size",
        "learning_rate",
        "lora_rank",
        "eval_every",
        "warmup_steps",
        "max_seq_len",
    } & set(plan.auto)
    assert plan.max_seq_len == 512
    assert plan.lora_alpha == 32 and "lora_alpha" in plan.auto


def test_full_fine_tuning_has_no_rank():
    plan = make(800, method="full")
    assert plan.lora_rank is None and plan.lora_alpha is None and "lora_rank" not in plan.auto


def test_auto_batch_does_not_shrink_when_nothing_fits():
    choice = auto.auto_batch_size(800, 3, 1, 1, fits=lambda b: False, device_name="l4-24gb")
    assert choice.value == 8 and "even at 1" in choice.reason


# ----------------------------------------------------------------------------- max_seq_len (issue 26)

LENGTHS = sorted([100] * 95 + [900, 1_200, 2_000, 3_000, 40_000])  # 100 records, one far longer than the rest


def test_max_seq_len_is_the_longest_record_when_it_fits():
    choice = auto.auto_max_seq_len(sorted([120, 300, 1_556]), 4_096, fits=lambda n: True, device_name="h100-80gb")
    assert choice.value == 1_556
    assert "1,556" in choice.reason and "4,096-token context window" in choice.reason and "h100-80gb" in choice.reason
    assert auto.auto_max_seq_len([5, 9], None, None).value == 9  # nothing known to check: every record whole


def test_max_seq_len_over_the_context_window_is_the_99th_percentile():
    choice = auto.auto_max_seq_len(LENGTHS, 32_768, fits=lambda n: True)
    assert choice.value == 3_000  # the 99th of 100 records by nearest rank; the 40,000-token one is split
    assert "40,000" in choice.reason and "32,768-token context window" in choice.reason and "99th" in choice.reason
    capped = auto.auto_max_seq_len(LENGTHS, 1_000, None)
    assert capped.value == 1_000 and "capped" in capped.reason  # never over the window


def test_max_seq_len_over_the_memory_is_at_most_what_fits():
    choice = auto.auto_max_seq_len(LENGTHS, 131_072, fits=lambda n: n <= 2_500, device_name="l4-24gb")
    assert choice.value == 2_500 and "l4-24gb's memory" in choice.reason and "2,500" in choice.reason
    # when the model alone does not fit, the length is not what to change: every record whole
    assert auto.auto_max_seq_len(LENGTHS, None, fits=lambda n: False).value == 40_000


@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=300), st.integers(1, 200_000))
def test_max_seq_len_never_exceeds_the_window_or_the_longest_record(lengths, window):
    choice = auto.auto_max_seq_len(sorted(lengths), window)
    assert 1 <= choice.value <= min(window, max(lengths)) and choice.reason


def test_max_seq_len_of_a_what_if_plan_is_1024_for_want_of_data():
    assert auto.auto_max_seq_len(None) == auto.Choice(1024, "no data to measure: 1,024 tokens")
    assert auto.auto_max_seq_len(None, 512).value == 512
    plan = make(800)
    assert plan.max_seq_len == 1024 and plan.auto["max_seq_len"].startswith("no data to measure")


def test_the_plan_takes_the_limit_the_data_was_fitted_to():
    from dataclasses import replace

    data = replace(what_if_summary(RunConfig(), 800, 400_000), max_seq_len=1_556, max_seq_len_reason="longest")
    plan = build_plan(RunConfig(), replace(data, what_if=False, max_record_tokens=1_556))
    assert plan.max_seq_len == 1_556 and plan.auto["max_seq_len"] == "longest"
    assert build_plan(RunConfig(max_seq_len=2_048), data).max_seq_len == 2_048
