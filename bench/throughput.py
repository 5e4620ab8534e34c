"""Throughput and memory of `finetune` against TRL's SFTTrainer and a bare PyTorch loop, side by side.

    .venv/bin/python bench/throughput.py --results bench/RESULTS.md   # ~10 min on 2 quiet CPU cores
    .venv/bin/python bench/throughput.py --methods lora --rounds 1 --timed 4 --systems finetune,bare   # a quick look
    .venv/bin/python bench/throughput.py --model smollm2-135m-instruct --methods lora --precisions fp32,default \
        --systems finetune,trl-packed      # each side at its own default precision, and both in fp32, in one run

One invocation builds the data set (bench/data.py, deterministic) and a toy Llama model sized for
the CPU, then runs every configuration in its own subprocess (so peak memory does not mix), in
alternating order (round 1: finetune, TRL padded, TRL packed, bare...; round 2: the same...), so
that a change in machine load hits every configuration alike and the ratios stay meaningful:

    finetune      RunConfig(..., packing=True) through finetune.train: padding-free packed rows,
                  length-grouped micro-batches (on a CPU run as passes of at most one row), chunked
                  LM head + loss on target positions only
    trl-padded    SFTTrainer, assistant_only_loss=True, TRL's default padded batches
    trl-packed    SFTTrainer, packing=True (BFD, padding-free rows of max_length), batch 1 x accum 8:
                  the best TRL configuration on the CPU
    bare          a plain loop on pre-tokenized fixed-shape tensors: model(x, labels=x).loss.backward()
                  (every position scored, no data pipeline): the issue's reference ceiling
    bare-fused    the same fixed-shape loop scoring the data's own targets through finetune's chunked
                  LM head: finetune's kernels without its data pipeline

`--precisions` runs every configuration at each precision listed: `fp32` (every side in fp32, no autocast), `bf16`
(every side in bf16: finetune `dtype="bf16"`, TRL `bf16=True`), `default` (each side as it ships: finetune's Auto,
which picks bf16 or fp32 for this machine and model and says which in the table, TRL's `bf16=True`); the bare loops
run in fp32 only. The default is `fp32`. Otherwise every side is set explicitly and identically: no gradient
checkpointing, no torch.compile,
AdamW (lr, betas, eps, no weight decay), grad-norm clipping 1.0, LoRA r=16 alpha=32 on all linear
layers (or full fine-tuning), max length 1024, batch 4 x accumulation 2 = 8 records per optimizer
step. `finetune` and `trl-padded` see the very same records in every optimizer step (TRL gets the
data in finetune's step order with a sequential sampler). Timing covers optimizer steps only: from
the end of the last warm-up step to the end of the last step, minus the time finetune spends saving
its checkpoint. Besides wall-clock throughput, tokens per CPU-second of the process are reported:
on a machine shared with other work they are the steadier measure of the work each system does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SYSTEMS = ("finetune", "trl-padded", "trl-packed", "bare", "bare-fused")

# ChatML exactly as finetune.ship.toy.CHAT_TEMPLATE renders it, plus the {% generation %} markers TRL's
# assistant_only_loss needs: the assistant content and its end-of-turn token are the targets.
GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class Spec:
    """One run: what the worker subprocess executes."""

    system: str
    method: str  # lora | full
    model: str
    data: str
    out: str
    batch: int = 4
    accum: int = 2
    warmup: int = 1
    timed: int = 4
    lr: float = 1e-4
    max_len: int = 1024
    lora_r: int = 16
    lora_alpha: int = 32
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 | default (the system's own)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.timed


@dataclass
class Result:
    system: str
    method: str
    step_end: list[float] = field(default_factory=list)  # perf_counter at the end of every optimizer step
    step_cpu: list[float] = field(default_factory=list)  # process CPU time (all threads) at the same moments
    target_tokens: list[int] = field(default_factory=list)  # per step: scored tokens
    real_tokens: list[int] = field(default_factory=list)  # per step: tokens of real data (no padding)
    compute_tokens: list[int] = field(default_factory=list)  # per step: positions run through the model
    records: list[int] = field(default_factory=list)  # per step: records (conversations), packed or not
    peak_rss_timed_mb: float = 0.0  # highest RSS sampled during the timed steps
    peak_rss_process_mb: float = 0.0  # getrusage high-water mark of the whole process
    gpu_peak_mb: float | None = None
    setup_s: float = 0.0  # process start to the end of the first step
    step_loss: list[float] = field(default_factory=list)  # per step: mean loss over the step's target tokens
    precision_used: str = "fp32"  # what the system actually ran in (finetune: its plan's dtype)


# ---------------------------------------------------------------------------- measurement helpers


class StepRecorder:
    """Collects per-micro-batch token counts, closes them into optimizer steps, samples RSS."""

    def __init__(self, spec: Spec, result: Result) -> None:
        self.spec, self.result = spec, result
        self.pending = [0, 0, 0, 0]  # target, real, compute, records of the current step
        self.pending_loss = 0.0
        self.peak_rss = 0
        self.excluded = [0.0, 0.0]  # wall and CPU seconds spent saving checkpoints: not training
        self._sampling = False
        self._thread: threading.Thread | None = None

    def micro(self, targets: int, real: int, compute: int, records: int) -> None:
        for i, value in enumerate((targets, real, compute, records)):
            self.pending[i] += int(value)

    def add_loss(self, loss: float) -> None:
        self.pending_loss += loss

    def exclude(self, wall: float, cpu: float) -> None:
        self.excluded[0] += wall
        self.excluded[1] += cpu

    def step_done(self) -> None:
        import torch

        r = self.result
        r.step_end.append(time.perf_counter() - self.excluded[0])
        r.step_cpu.append(time.process_time() - self.excluded[1])
        for values, value in zip(
            (r.target_tokens, r.real_tokens, r.compute_tokens, r.records), self.pending, strict=True
        ):
            values.append(value)
        self.pending = [0, 0, 0, 0]
        r.step_loss.append(self.pending_loss)
        self.pending_loss = 0.0
        done = len(r.step_end)
        if done == 1:
            r.setup_s = time.perf_counter() - PROCESS_START
        if done == self.spec.warmup:  # the timed window starts at the end of the last warm-up step
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            self._start_sampling()
        if done == self.spec.warmup + self.spec.timed:
            self._stop_sampling()
            if torch.cuda.is_available():
                r.gpu_peak_mb = torch.cuda.max_memory_allocated() / 2**20

    def _start_sampling(self) -> None:
        import psutil

        proc = psutil.Process()
        self._sampling = True

        def sample() -> None:
            while self._sampling:
                self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
                time.sleep(0.005)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def _stop_sampling(self) -> None:
        self._sampling = False
        if self._thread:
            self._thread.join()
        self.result.peak_rss_timed_mb = self.peak_rss / 2**20

    def finish(self) -> None:
        self.result.peak_rss_process_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---------------------------------------------------------------------------- the workers


def run_finetune(spec: Spec, rec: StepRecorder) -> None:
    """The product path: RunConfig -> finetune.train, exactly what `finetune train` runs."""
    from finetune.run import train
    from finetune.settings.config import RunConfig
    from finetune.train.attention import uses_varlen_attention
    from finetune.train.objective import TokenNormalisedSFT

    class Counted(TokenNormalisedSFT):
        """Instrumentation only (the loss is unchanged): count what each micro-batch runs."""

        def loss(self, model, batch):
            flat = batch.flat_index is not None and uses_varlen_attention(model)  # filler dropped: one flat row
            records = len(batch.cu_seq_lens) - 1 if batch.cu_seq_lens is not None else batch.input_ids.shape[0]
            compute = batch.num_tokens if flat else batch.input_ids.numel()
            rec.micro(batch.num_targets, batch.num_tokens, compute, records)
            return super().loss(model, batch)

    config = RunConfig(
        data=spec.data,
        model=spec.model,
        out=spec.out,
        method=spec.method,
        lora_rank=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=0.0,
        epochs=1,
        batch_size=spec.batch,
        grad_accum=spec.accum,
        lr=spec.lr,
        warmup_steps=0,
        schedule="cosine",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=spec.total_steps,
        max_seq_len=spec.max_len,
        val_fraction=0,
        replay="off",  # the same records as the peers: Auto's replay would add general rows on a real base
        adapter_scale="off",
        save_every=10**6,
        gradient_checkpointing=False,
        dtype="auto" if spec.precision == "default" else spec.precision,
        packing=True,
        seed=spec.seed,
    )

    def on_step(row: dict) -> None:
        if "checkpoint_s" in row:  # checkpoints are not training: leave them out of the step times
            rec.exclude(row["checkpoint_s"], row["checkpoint_cpu_s"])
        rec.add_loss(row["train_loss"])
        rec.step_done()

    plan = train(config, on_step=on_step, objective=Counted()).plan
    rec.result.precision_used = plan.dtype + (" (Auto)" if spec.precision == "default" else "")


def finetune_step_order(spec: Spec) -> list[int]:
    """Record indices in the order finetune's optimizer steps take them (epoch 0, then 1, ...)."""
    from finetune.train.order import epoch_steps

    n = sum(1 for line in Path(spec.data).read_text().splitlines() if line.strip())
    effective = spec.batch * spec.accum
    order: list[int] = []
    epoch = 0
    while len(order) < spec.total_steps * effective:
        order += [i for step in epoch_steps(n, effective, spec.seed, epoch, "keep") for i in step]
        epoch += 1
    return order


def run_trl(spec: Spec, rec: StepRecorder, packed: bool) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rows = [json.loads(line) for line in Path(spec.data).read_text().splitlines() if line.strip()]
    # packed: TRL packs the whole data set (BFD) and samples packs at random, its own default; padded: the
    # very records of finetune's optimizer steps, in order, read sequentially
    dataset = Dataset.from_list(rows if packed else [rows[i] for i in finetune_step_order(spec)])
    tokenizer = AutoTokenizer.from_pretrained(spec.model)
    tokenizer.chat_template = generation_template_for(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=torch.float32, use_safetensors=True)
    peft_config = None
    if spec.method == "lora":
        peft_config = LoraConfig(
            r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=0.0, target_modules="all-linear",
            task_type="CAUSAL_LM",
        )  # fmt: skip
    batch, accum = (1, spec.batch * spec.accum) if packed else (spec.batch, spec.accum)
    args = SFTConfig(
        output_dir=spec.out,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accum,
        max_steps=spec.total_steps,
        learning_rate=spec.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        optim="adamw_torch",
        max_grad_norm=1.0,
        gradient_checkpointing=False,  # TRL 1.x defaults to True
        bf16=spec.precision != "fp32",  # TRL 1.x defaults to True: autocast over fp32 weights
        fp16=False,
        torch_compile=False,
        use_cpu=not torch.cuda.is_available(),
        max_length=spec.max_len,
        assistant_only_loss=True,
        packing=packed,
        train_sampling_strategy="random" if packed else "sequential",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=spec.seed,
        data_seed=spec.seed,
    )

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            rec.step_done()

    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
        callbacks=[Steps()],
    )  # fmt: skip
    compute_loss = trainer.compute_loss

    def counted(model, inputs, *a, **kw):  # instrumentation only: count what each micro-batch runs
        ids, labels = inputs["input_ids"], inputs["labels"]
        targets = int((labels[:, 1:] != -100).sum())
        if "attention_mask" in inputs:
            real = int(inputs["attention_mask"].sum())
            rows_in = ids.shape[0]
        else:  # padding-free: one flat row; records start where position_ids restart at 0
            real = ids.numel()
            rows_in = int((inputs["position_ids"] == 0).sum())
        rec.micro(targets, real, ids.numel(), rows_in)
        loss = compute_loss(model, inputs, *a, **kw)
        rec.add_loss(float(loss.detach()))  # each micro-batch: its nll sum over the step's target count
        return loss

    trainer.compute_loss = counted
    trainer.train()
    rec.result.precision_used = (
        "fp32"
        if spec.precision == "fp32"
        else "bf16 autocast, fp32 weights" + (" (TRL's default)" if spec.precision == "default" else "")
    )


def run_bare(spec: Spec, rec: StepRecorder, fused: bool = False) -> None:
    """The ceiling: the same model on pre-tokenized fixed-shape tensors, plain AdamW, no data pipeline.

    Shape [batch, mean record length] per micro-batch, cut from the data's token stream, so one
    optimizer step runs about as many tokens as an average finetune step. `bare` is the textbook
    loop, `model(x, labels=x).loss` (every position scored, full logits); `bare-fused` scores the
    data's own targets through finetune's chunked LM head (loss.nll_sum): the same kernels as
    finetune without batching, packing or bookkeeping.
    """
    import torch

    from finetune.data.prepare import prepare_data
    from finetune.data.tokenize import load_tokenizer
    from finetune.data.types import IGNORE_INDEX
    from finetune.settings.config import RunConfig
    from finetune.train.batching import Batch
    from finetune.train.cross_entropy import nll_sum
    from finetune.train.model import add_lora, load_model

    tokenizer = load_tokenizer(spec.model)
    prepared = prepare_data(
        RunConfig(data=spec.data, model=spec.model, val_fraction=0, max_seq_len=spec.max_len), tokenizer
    )
    stream = [t for r in prepared.train for t in r.input_ids]
    labels = [t for r in prepared.train for t in r.labels]
    width = round(len(stream) / len(prepared.train))  # the mean record length
    usable = (len(stream) // width) * width
    blocks = torch.tensor(stream[:usable]).view(-1, width)
    label_blocks = torch.tensor(labels[:usable]).view(-1, width)
    per_step = spec.batch * spec.accum
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(spec.model)
    if spec.method == "lora":
        model = add_lora(model, spec.lora_r, spec.lora_alpha, 0.0, spec.seed)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for step in range(spec.total_steps):
        total = torch.zeros(())
        for micro in range(spec.accum):
            start = (step * per_step + micro * spec.batch) % (len(blocks) - spec.batch)
            x = blocks[start : start + spec.batch].to(device)
            if fused:
                targets = torch.cat(
                    [label_blocks[start : start + spec.batch, 1:], torch.full((x.shape[0], 1), IGNORE_INDEX)], 1
                )
                positions = torch.arange(width).expand_as(x)
                batch = Batch(x, positions, targets, (targets != IGNORE_INDEX).float(), None, x.numel()).to(device)
                n_targets = batch.num_targets
                loss = nll_sum(model, batch) / (n_targets * spec.accum)
            else:
                n_targets = x.numel() - x.shape[0]
                loss = model(input_ids=x, labels=x, use_cache=False).loss / spec.accum
            loss.backward()
            total += float(loss.detach())
            rec.micro(n_targets, x.numel(), x.numel(), x.shape[0])
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rec.add_loss(float(total))
        rec.step_done()


# ---------------------------------------------------------------------------- the worker entry point

PROCESS_START = time.perf_counter()


def worker(spec_path: str) -> None:
    spec = Spec(**json.loads(Path(spec_path).read_text()))
    result = Result(spec.system, spec.method, precision_used="fp32")
    rec = StepRecorder(spec, result)
    if spec.system == "finetune":
        run_finetune(spec, rec)
    elif spec.system in ("trl-padded", "trl-packed"):
        run_trl(spec, rec, packed=spec.system == "trl-packed")
    elif spec.system in ("bare", "bare-fused"):
        run_bare(spec, rec, fused=spec.system == "bare-fused")
    else:
        raise SystemExit(f"unknown system {spec.system!r}")
    rec.finish()
    Path(spec.out, "result.json").write_text(json.dumps(asdict(result)))


# ---------------------------------------------------------------------------- the parent: build, run, report


@dataclass
class Summary:
    """Several runs of one configuration, pooled: tokens of all timed steps over their total time."""

    name: str
    method: str
    precision: str  # what was asked: fp32 | bf16 | default
    precision_used: str  # what ran
    runs: int
    steps: int
    seconds: float
    cpu_seconds: float
    target: int
    real: int
    compute: int
    records: int
    peak_rss_timed_mb: float
    peak_rss_process_mb: float
    gpu_peak_mb: float | None
    tok_s_per_run: list[float]

    @property
    def target_tok_s(self) -> float:
        return self.target / self.seconds

    @property
    def real_tok_s(self) -> float:
        return self.real / self.seconds

    @property
    def padding_share(self) -> float:
        return 1 - self.real / self.compute if self.compute else 0.0


def summarize(name: str, results: list[dict], warmup: int, timed: int, precision: str = "fp32") -> Summary:
    seconds = cpu_seconds = target = real = compute = records = steps = 0
    per_run = []
    for r in results:
        window = slice(warmup, warmup + timed)  # steps warmup+1 .. warmup+timed (0-based indices)
        elapsed = r["step_end"][warmup + timed - 1] - r["step_end"][warmup - 1]
        seconds += elapsed
        cpu_seconds += r["step_cpu"][warmup + timed - 1] - r["step_cpu"][warmup - 1]
        target += sum(r["target_tokens"][window])
        real += sum(r["real_tokens"][window])
        compute += sum(r["compute_tokens"][window])
        records += sum(r["records"][window])
        steps += timed
        per_run.append(sum(r["target_tokens"][window]) / elapsed)
    gpu = [r["gpu_peak_mb"] for r in results if r["gpu_peak_mb"] is not None]
    return Summary(
        name=name,
        method=results[0]["method"],
        precision=precision,
        precision_used=results[0].get("precision_used", "fp32"),
        runs=len(results),
        steps=steps,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        target=target,
        real=real,
        compute=compute,
        records=records,
        peak_rss_timed_mb=max(r["peak_rss_timed_mb"] for r in results),
        peak_rss_process_mb=max(r["peak_rss_process_mb"] for r in results),
        gpu_peak_mb=max(gpu) if gpu else None,
        tok_s_per_run=per_run,
    )


def prepare_assets(work: Path, conversations: int, hidden: int, layers: int, model_vocab: int) -> tuple[Path, Path]:
    from bench.data import write_dataset
    from finetune.ship.toy import ToySize, build_toy_model

    data = write_dataset(work / "bench.jsonl", n=conversations, seed=0)
    heads = max(1, hidden // 64)
    size = ToySize(
        hidden=hidden, layers=layers, heads=heads, kv_heads=max(1, heads // 2), intermediate=hidden * 8 // 3 // 8 * 8,
        vocab=8192, model_vocab=model_vocab,
    )  # fmt: skip
    model = build_toy_model(work / "model", data=data, size=size)
    check_generation_template(model)
    return data, model


def generation_template_for(tokenizer) -> str:
    """GENERATION_TEMPLATE, with the default system turn the model's own template adds to a chat without one
    (SmolLM2's does): TRL then reads the very tokens finetune reads."""
    chat = [{"role": "user", "content": "u"}]
    ours = tokenizer.apply_chat_template(chat, tokenize=False)
    plain = tokenizer.apply_chat_template(chat, tokenize=False, chat_template=GENERATION_TEMPLATE)
    if ours == plain or not ours.endswith(plain):
        return GENERATION_TEMPLATE
    default = ours[: -len(plain)].replace("'", "\\'").replace("\n", "\\n")
    return "{% if messages[0]['role'] != 'system' %}{{ '" + default + "' }}{% endif %}" + GENERATION_TEMPLATE


def check_generation_template(model: Path) -> None:
    """TRL's copy of the template must render byte for byte what finetune's renders."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    turns = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "v"},
        {"role": "assistant", "content": "b"},
    ]
    for chat in ([{"role": "system", "content": "s"}, *turns], turns):
        ours = tok.apply_chat_template(chat, tokenize=False)
        theirs = tok.apply_chat_template(chat, tokenize=False, chat_template=generation_template_for(tok))
        assert ours == theirs, (ours, theirs)


def run_one(spec: Spec, timeout: float) -> dict:
    Path(spec.out).mkdir(parents=True, exist_ok=True)
    spec_path = Path(spec.out) / "spec.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{spec.system} ({spec.method}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads((Path(spec.out) / "result.json").read_text())


def load_snapshot() -> str:
    """`uptime` and the head of `top`, to record how busy the machine was."""
    parts = []
    for cmd in (["uptime"], ["top", "-bn1"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            parts.append("\n".join(out.splitlines()[:12]))
        except (OSError, subprocess.SubprocessError):
            parts.append(f"({cmd[0]} not available)")
    return "\n".join(parts)


def versions() -> dict:
    import peft
    import torch
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "trl": trl.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def render_table(summaries: list[Summary]) -> str:
    by_key = {(s.method, s.name, s.precision): s for s in summaries}
    lines = [
        "| method | system | precision asked | ran in | records/step | real tok/step | padding | s/step | target tok/s | total tok/s "
        "| target tok/CPU-s | peak RSS timed (MB) | peak RSS process (MB) | × TRL padded | × TRL packed "
        "| vs bare (total tok/s) | vs bare-fused |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        padded, packed = (by_key.get((s.method, n, s.precision)) for n in ("trl-padded", "trl-packed"))
        bare, fused = (by_key.get((s.method, n, "fp32")) for n in ("bare", "bare-fused"))
        ratio = lambda other, s=s: f"{s.target_tok_s / other.target_tok_s:.2f}×" if other else "-"  # noqa: E731
        vs_bare = f"{s.real_tok_s / bare.real_tok_s:.0%}" if bare else "-"
        vs_fused = f"{s.real_tok_s / fused.real_tok_s:.0%}" if fused else "-"
        gpu = f" (GPU {s.gpu_peak_mb:,.0f})" if s.gpu_peak_mb is not None else ""
        lines.append(
            f"| {s.method} | {s.name} | {s.precision} | {s.precision_used} | {s.records / s.steps:.1f} | {s.real / s.steps:,.0f} | {s.padding_share:.0%} "
            f"| {s.seconds / s.steps:.2f} | {s.target_tok_s:,.0f} | {s.real_tok_s:,.0f} "
            f"| {s.target / s.cpu_seconds:,.0f} | {_mb(s.peak_rss_timed_mb)}{gpu} "
            f"| {_mb(s.peak_rss_process_mb)} | {ratio(padded)} | {ratio(packed)} | {vs_bare} | {vs_fused} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="finetune vs TRL SFTTrainer vs a bare loop: tokens/s and peak memory")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--methods", default="lora,full", help="comma-separated: lora, full")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; each runs every configuration once")
    parser.add_argument("--precisions", default="fp32", help="comma-separated: fp32, bf16, default (each system's own)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps at the start of each run")
    parser.add_argument("--timed", type=int, default=4, help="timed optimizer steps per run")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--model", default=None, help="a real model (folder, .gguf or pulled base) instead of the toy")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32768, help="model vocabulary (embedding and LM-head rows)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--work", help="folder for data, model and runs (default: a temporary folder)")
    parser.add_argument("--results", help="write the Markdown report here (e.g. bench/RESULTS.md)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed for one run")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.timed < 1:
        parser.error("--warmup and --timed must be at least 1 (the timed window starts at the end of a step)")
    if args.worker:
        worker(args.worker)
        return

    methods = [m for m in args.methods.split(",") if m]
    systems = [s for s in args.systems.split(",") if s]
    work = Path(args.work or tempfile.mkdtemp(prefix="finetune-bench-"))
    load_before = load_snapshot()
    started = time.time()
    if args.model:
        from bench.data import write_dataset
        from finetune.models.source import resolve_model

        data, model = write_dataset(work / "bench.jsonl", n=args.conversations, seed=0), Path(resolve_model(args.model))
        check_generation_template(model)  # TRL's marked copy must render what the model's own template renders
        print(f"data {data}, model {model}", flush=True)
    else:
        data, model = prepare_assets(work, args.conversations, args.hidden, args.layers, args.vocab)
        print(
            f"data {data}, model {model} (hidden {args.hidden} x {args.layers} layers, vocab {args.vocab})", flush=True
        )

    precisions = [p for p in args.precisions.split(",") if p]
    results: dict[tuple[str, str, str], list[dict]] = {}
    for method in methods:
        for round_index in range(args.rounds):
            for system, precision in [(s, p) for s in systems for p in precisions if p == "fp32" or "bare" not in s]:
                name = system
                spec = Spec(
                    system=system, method=method, model=str(model), data=str(data),
                    out=str(work / "runs" / f"{method}-{name}-{precision}-{round_index}"), warmup=args.warmup,
                    timed=args.timed, lr=args.lr, precision=precision,
                )  # fmt: skip
                t = time.perf_counter()
                result = run_one(spec, args.timeout)
                results.setdefault((method, name, precision), []).append(result)
                s = summarize(name, [result], args.warmup, args.timed, precision)
                print(
                    f"[{method} round {round_index + 1}] {name:<12} {precision:<8} {s.target_tok_s:8,.0f} target tok/s "
                    f"{s.real_tok_s:8,.0f} total tok/s  {s.seconds / s.steps:6.2f} s/step  "
                    f"RSS {s.peak_rss_timed_mb:,.0f} MB  ({time.perf_counter() - t:.0f} s wall)",
                    flush=True,
                )
    summaries = [summarize(name, runs, args.warmup, args.timed, p) for (_, name, p), runs in results.items()]
    table = render_table(summaries)
    load_after = load_snapshot()
    print()
    print(table)
    if args.results:
        facts = data_facts(data, model)
        write_results(
            Path(args.results), args, argv, table, summaries, load_before, load_after, time.time() - started, facts
        )
        print(f"\nwritten to {args.results}")


def data_facts(data: Path, model: Path) -> str:
    """The token lengths of the benchmark's records, as finetune tokenizes them."""
    from finetune.data.prepare import prepare_data
    from finetune.data.tokenize import load_tokenizer
    from finetune.settings.config import RunConfig

    prepared = prepare_data(RunConfig(data=str(data), model=str(model), val_fraction=0), load_tokenizer(str(model)))
    lengths = sorted(len(r) for r in prepared.train)
    targets = sum(r.num_targets for r in prepared.train)
    pick = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
    return (
        f"{len(lengths)} records, tokens per record min {lengths[0]}, median {pick(0.5)}, mean "
        f"{sum(lengths) / len(lengths):.0f}, p95 {pick(0.95)}, max {lengths[-1]}; "
        f"{targets / sum(lengths):.0%} of the tokens are targets (assistant replies and their end-of-turn)"
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


NOTES = """\
How to read it:
- *target tok/s*: scored tokens (assistant replies and their end-of-turn) per second of optimizer
  steps, the work a user pays for. *total tok/s*: tokens of real data (context and targets, never
  padding) per second. *padding*: share of the positions run through the model that are padding
  or packing filler. *target tok/CPU-s*: target tokens per CPU-second of the process (all its
  threads): steadier than wall time when other work shares the machine.
- *× TRL padded / × TRL packed*: target tok/s over TRL's. *vs bare*: total tok/s over the bare loop's.
- *peak RSS timed*: highest resident memory sampled (every 5 ms) during the timed steps; *process*:
  the whole process's high-water mark, start-up and model loading included. On a GPU the timed
  column adds `torch.cuda.max_memory_allocated`.

Precision: the *precision asked* column (`--precisions`); *ran in* says what each side ran (finetune's plan records its
choice; TRL's bf16 is autocast over fp32 weights, finetune's a LoRA base held in bf16 under autocast with the adapter
and AdamW in fp32). Otherwise set identically on every side: no gradient checkpointing (TRL 1.x defaults to
bf16 and checkpointing: both switched off), no torch.compile, AdamW (betas 0.9/0.999, eps 1e-8, no
weight decay), grad-norm clipping 1.0, lr 1e-4 cosine, no warm-up, LoRA r 16 / alpha 32 / dropout 0
on all linear layers of the blocks (or full fine-tuning), max length 1024, batch 4 × accumulation 2.

TRL's side: `SFTTrainer` with conversational data (`messages`) and `assistant_only_loss=True`. TRL
1.16 needs `{% generation %}` markers for that; the toy tokenizer's ChatML template has none, so
TRL gets a copy of the template with the markers around each assistant reply and its `<|im_end|>`,
checked at start to render byte for byte what finetune renders: both sides score the same tokens.
`trl-padded` is TRL's default (padded batches); it reads the data in finetune's step order with a
sequential sampler, so both see the same 8 records in every optimizer step. `trl-packed` is TRL's
best configuration on the CPU: `packing=True` (BFD, which turns on its padding-free rows) with
batch 1 × accumulation 8, so a step holds 8 packs of up to 1024 tokens (about 3× the tokens of a
record step: throughput is counted per token, and the bigger step only spreads the optimizer's
cost over more tokens, in TRL's favour). TRL scores every position through its fused LM head on
the CPU (its compact, targets-only path is for Triton devices) and computes entropy and accuracy
metrics every micro-batch: that is TRL as shipped.

finetune's side: `finetune.train(RunConfig(...))`, the same code as `finetune train`, with validation
off; the checkpoint written after the last step is left out of the timing. Packed micro-batches run
as one row of real tokens with attention record by record (`loss.use_varlen_attention`), and AdamW
uses the fused kernel. On a CPU finetune runs each micro-batch of 4 records as forward/backward passes
of whole records of at most one 1,024-token row (`pass_tokens`, its default there: the same gradient, a
longer pass buys a CPU no speed, docs/arithmetic.md), about the size of one of TRL packed's rows.
"""


def _model_line(args) -> str:
    if args.model:
        return f"Model: {args.model} (its own tokenizer and chat template; TRL gets the same ChatML turns, marked)."
    return (
        f"Model: toy Llama architecture (finetune/ship/toy.py), hidden {args.hidden} × {args.layers} layers, vocabulary "
        f"{args.vocab:,} rows\n(embedding and LM head; the BPE tokenizer trained on the data uses the first few thousand)."
    )


def write_results(path, args, argv, table, summaries, load_before, load_after, wall, facts) -> None:
    command = " ".join(["python bench/throughput.py", *(argv if argv is not None else sys.argv[1:])])
    per_run = "\n".join(
        f"- {s.method} {s.name} ({s.precision}): " + ", ".join(f"{x:,.0f}" for x in s.tok_s_per_run) + " target tok/s"
        for s in summaries
    )
    v = versions()
    text = f"""# Throughput benchmark: finetune vs TRL SFTTrainer vs a bare PyTorch loop

Reproduce: `.venv/bin/{command}` (whole run: {wall / 60:.1f} min).

Machine: {v["cores"]} CPU cores ({_cpu_name()}), torch threads {v["threads"]}, device {v["device"]}.
Versions: Python {v["python"]}, torch {v["torch"]}, transformers {v["transformers"]}, peft {v["peft"]}, TRL {v["trl"]}.
{_model_line(args)}
Data: bench/data.py, {args.conversations} conversations, seed 0: {facts}.
Runs: {args.rounds} alternating round(s) of every configuration, {args.warmup} warm-up + {args.timed} timed optimizer
steps each, every run in its own process.

{table}

Per-run target tokens/s (alternating order):
{per_run}

{NOTES}
Load before:
```
{load_before}
```
Load after:
```
{load_after}
```
"""
    path.write_text(text)


if __name__ == "__main__":
    main()
