"""Model facts (real parameter counts without torch), memory by part, Auto's memory decisions, and cost."""

import json
import math

import pytest

from finetune.models.facts import BUILTIN_CONFIGS, load_model_facts
from finetune.plan.build import build_plan
from finetune.plan.what_if import what_if_summary
from finetune.rules.cost import estimate_cost, training_flops
from finetune.rules.memory import (
    DEVICES,
    GIB,
    decide_gradient_checkpointing,
    decide_shard,
    estimate_memory,
    resolve_device,
)
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError

LLAMA_8B = load_model_facts("meta-llama/Llama-3.1-8B")
H100 = DEVICES["h100-80gb"]

# published parameter counts (model cards / safetensors metadata)
PUBLISHED = {
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
}


# ----------------------------------------------------------------------------- model facts


@pytest.mark.parametrize(("name", "count"), PUBLISHED.items())
def test_builtin_table_matches_published_sizes(name, count):
    facts = load_model_facts(name)
    assert facts.total_params == count and "built-in table" in facts.source


def test_builtin_table_is_case_insensitive_and_complete():
    assert load_model_facts("qwen/qwen2.5-0.5b-instruct").total_params == PUBLISHED["Qwen/Qwen2.5-0.5B"]
    assert all(load_model_facts(name) for name in BUILTIN_CONFIGS)


def test_unknown_models():
    assert load_model_facts(None) is None
    assert load_model_facts("someone/unknown-model-13B") is None


def test_a_config_json_alone(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BUILTIN_CONFIGS["Qwen/Qwen2.5-0.5B"]))
    assert load_model_facts(str(path)).total_params == PUBLISHED["Qwen/Qwen2.5-0.5B"]
    assert load_model_facts(str(tmp_path)).total_params == PUBLISHED["Qwen/Qwen2.5-0.5B"]
    path.write_text("{}")
    with pytest.raises(UserError):
        load_model_facts(str(path))


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_config_formula_matches_transformers(model_type, tied):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(
        model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=tied,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    from finetune.rules.model_facts import from_config

    assert from_config(cfg.to_dict(), model_type, "test").total_params == sum(p.numel() for p in model.parameters())


def test_toy_model_count_and_lora_params(toy_model):
    """The real toy model: safetensors headers, the config formula and PEFT all agree with torch."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from finetune.rules.model_facts import from_config

    folder = toy_model
    facts = load_model_facts(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    real = sum(p.numel() for p in model.parameters())
    assert facts.total_params == real and "safetensors" in facts.source and facts.exact
    formula = from_config(json.loads((folder / "config.json").read_text()), "toy", "test")
    assert formula.total_params == real
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    assert facts.lora_params(4) == sum(p.numel() for p in lora.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------- memory


def test_memory_full_vs_lora():
    full = estimate_memory(LLAMA_8B, "full", 1, 1024, False)
    lora = estimate_memory(LLAMA_8B, "lora", 1, 1024, False, lora_rank=8)
    n, p = LLAMA_8B.total_params, LLAMA_8B.lora_params(8)
    assert (full.weights, full.gradients, full.optimizer) == (4 * n, 4 * n, 8 * n)  # 16 bytes per parameter
    assert lora.trainable_parameters == p == 20_971_520
    assert (lora.weights, lora.gradients, lora.optimizer) == (2 * n + 4 * p, 4 * p, 8 * p)
    assert full.total > 80 * GIB and not full.fits_device
    assert lora.fits_device and "l4-24gb" not in lora.fits  # bf16 base 15 GiB + activations: too tight for 24 GB
    assert "l4-24gb" in estimate_memory(LLAMA_8B, "lora", 1, 1024, True, lora_rank=8).fits  # with checkpointing


def test_checkpointing_saves_activation_memory():
    without = estimate_memory(LLAMA_8B, "lora", 8, 2048, False, lora_rank=8)
    with_ckpt = estimate_memory(LLAMA_8B, "lora", 8, 2048, True, lora_rank=8)
    assert with_ckpt.activations < without.activations / 2
    assert with_ckpt.activations_without_checkpointing == without.activations
    assert with_ckpt.total - with_ckpt.activations == without.total - without.activations


def test_activations_grow_with_micro_batch_and_fits_is_ordered():
    small = estimate_memory(LLAMA_8B, "lora", 1, 1024, False, lora_rank=8)
    large = estimate_memory(LLAMA_8B, "lora", 8, 1024, False, lora_rank=8)
    assert large.activations > small.activations and set(large.fits) <= set(small.fits)
    sizes = [DEVICES[name].memory_bytes for name in small.fits]
    assert sizes == sorted(sizes)


def test_sharding_divides_the_model_state():
    replica = estimate_memory(LLAMA_8B, "full", 1, 1024, True, devices=4, shard="none")
    sharded = estimate_memory(LLAMA_8B, "full", 1, 1024, True, devices=4, shard="full")
    assert sharded.optimizer == replica.optimizer // 4 and sharded.sharded and not replica.sharded


def test_unknown_model_memory():
    memory = estimate_memory(None, "lora", 8, 1024, False)
    assert not memory.known and memory.total is None and memory.fits_device is None


def test_devices_resolve():
    assert resolve_device(None) == (H100, True, True)
    assert resolve_device("H100") == (H100, False, True)
    assert resolve_device("a100")[2] is False  # ambiguous: 40 or 80 GB
    assert resolve_device("cpu")[0].memory_bytes is None


def test_decide_shard():
    replica = estimate_memory(LLAMA_8B, "full", 1, 1024, True, devices=4, device=DEVICES["a100-80gb"])
    assert decide_shard("full", 4, replica).value == "full"
    assert decide_shard("full", 1, replica).value == "none"
    assert decide_shard("lora", 4, replica).value == "none"
    small = estimate_memory(load_model_facts("Qwen/Qwen2.5-0.5B"), "full", 1, 1024, True, devices=4)
    assert decide_shard("full", 4, small).value == "none"


def test_decide_gradient_checkpointing():
    l4 = DEVICES["l4-24gb"]
    on = decide_gradient_checkpointing(
        estimate_memory(LLAMA_8B, "lora", 1, 2048, False, lora_rank=8, device=l4, device_assumed=False),
        estimate_memory(LLAMA_8B, "lora", 1, 2048, True, lora_rank=8, device=l4, device_assumed=False),
    )
    off = decide_gradient_checkpointing(
        estimate_memory(LLAMA_8B, "lora", 1, 2048, False, lora_rank=8),
        estimate_memory(LLAMA_8B, "lora", 1, 2048, True, lora_rank=8),
    )
    assert on.value is True and off.value is False


def test_plan_picks_fsdp_and_checkpointing_for_full_8b_on_four_gpus():
    config = RunConfig(method="full", devices=4, gpu="a100-80gb", model="meta-llama/Llama-3.1-8B")
    plan = build_plan(config, what_if_summary(config, 2_000, 2_000_000), LLAMA_8B)
    assert plan.shard == "full" and "FSDP" in plan.auto["shard"]
    assert plan.memory.fits_device and plan.memory.sharded


def test_plan_shrinks_the_micro_batch_to_fit():
    config = RunConfig(gpu="l4-24gb", max_seq_len=2048)
    plan = build_plan(config, what_if_summary(config, 20_000, None), LLAMA_8B)
    assert plan.memory.fits_device and plan.batch_size < 32 and "l4-24gb" in plan.auto["batch_size"]
    assert plan.gradient_checkpointing and "does_not_fit_device" not in [w["code"] for w in plan.warnings]


# ----------------------------------------------------------------------------- cost


def test_flops():
    assert training_flops(10, 100, "full") == 6_000
    assert training_flops(10, 100, "lora") == 4_000
    assert training_flops(10, 100, "lora", gradient_checkpointing=True) == 6_000


def test_cost_by_tokens_and_time():
    cost = estimate_cost(1_200_000, True, 8_000_000_000, "lora", H100, False, 2, False, 3.0, 4.0)
    assert math.isclose(cost.token_cost, 3.6)
    assert math.isclose(cost.seconds, 4 * 8e9 * 1.2e6 / (2 * 989e12 * 0.35))
    assert math.isclose(cost.device_hours, cost.seconds / 3600 * 2)
    assert math.isclose(cost.time_cost, cost.device_hours * 4.0)
    assert cost.to_dict()["estimate"] is True and cost.tokens_exact


def test_cost_without_tokens_or_model():
    cost = estimate_cost(None, False, None, "lora", H100, True)
    assert cost.billed_tokens is None and cost.token_cost is None and cost.seconds is None and cost.notes


def test_a_cpu_plan_holds_one_packed_row_of_activations():
    """On a CPU a micro-batch runs in passes of at most one row (train/distributed.pass_tokens): the estimate
    counts the activations of one such pass, on a GPU those of the whole micro-batch."""
    facts = load_model_facts("Qwen/Qwen2.5-0.5B")
    memory = {}
    for gpu in ("cpu", "h100-80gb"):
        config = RunConfig(batch_size=16, max_seq_len=1024, method="lora", gpu=gpu, dtype="fp32")
        memory[gpu] = build_plan(config, what_if_summary(config, 1000, 200_000), facts).memory
    assert memory["cpu"].micro_batch_tokens == 1024 and memory["h100-80gb"].micro_batch_tokens == 16 * 1024
    assert memory["cpu"].activations * 16 == memory["h100-80gb"].activations


def test_cpu_time_is_a_rough_estimate():
    cost = estimate_cost(1000, True, 1_000_000, "full", DEVICES["cpu"], False)
    assert cost.mfu is None and cost.seconds > 0 and any("rough" in note for note in cost.notes)


def test_plan_cost_uses_tokens_processed():
    config = RunConfig(epochs=3, price_per_million_tokens=2.0, gpu_hour_price=3.0, gpu="h100-80gb")
    plan = build_plan(config, what_if_summary(config, 800, 400_000), LLAMA_8B)
    assert plan.cost.billed_tokens == plan.tokens_processed == 1_200_000
    assert math.isclose(plan.cost.token_cost, 2.4)
    assert plan.cost.time_cost is not None
