"""Build a tiny Llama-architecture causal LM and a real byte-level BPE tokenizer, offline, in seconds.

    finetune toy-model DIR [--data FILE]      random weights (the tests' plumbing model)
    finetune toy-model DIR --pretrain         a base that already speaks: pretrained on a generated,
                                              neutral general-purpose chat corpus (~65 s on 2 quiet cores)

The folder is written with `save_pretrained` and loads back through `AutoModelForCausalLM` /
`AutoTokenizer` exactly like a model from a hub: the demo and the tests use nothing else.
The pretrained base is bit-for-bit reproducible from its seed (on the same torch build and thread
count); `pretrained_base()` keeps one in a cache folder keyed by every parameter of the build.
The GGUF export's tests also build Qwen2 and Qwen3 toys: `build_toy_model(DIR, architecture="qwen2")`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from finetune.data.chat_template import CHATML_TEMPLATE
from finetune.models.gguf import cache_root
from finetune.settings.errors import UserError

IM_START = "<|im_start|>"
END_OF_TURN = "<|im_end|>"
PAD = "<|pad|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, END_OF_TEXT, IM_START, END_OF_TURN]

# A little English so the tokenizer has sensible merges when no data file is given.
DEFAULT_CORPUS = """\
Hello! Thanks for reaching out. I can help you with your account, your order, billing and shipping.
Could you tell me your order number? The package left our warehouse yesterday and should arrive soon.
To reset your password, open Settings, choose Security and follow the link we send to your email.
We are sorry for the trouble. A refund usually takes three to five business days to appear.
Is there anything else I can do for you today? Have a great day, and best regards from the team.
The quick brown fox jumps over the lazy dog. 0123456789 a b c d e f g h i j k l m n o p q r s t u v w x y z
"""


@dataclass(frozen=True)
class ToySize:
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 344
    vocab: int = 2048  # BPE vocabulary the tokenizer trains towards
    model_vocab: int | None = None  # embedding rows; pad above the tokenizer to mimic a big vocabulary
    max_positions: int = 4096


def _corpus_from_file(path: Path) -> Iterator[str]:
    """Every string value of a JSONL file (message contents, prompts, completions); plain lines otherwise."""
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            yield line
            continue
        yield from _strings(obj)


def _strings(obj: object) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)


def build_tokenizer(texts: list[str], vocab_size: int, architecture: str = "llama"):
    """Train a GPT-2-style byte-level BPE and wrap it as a transformers fast tokenizer with a chat template.

    The Qwen toys split text the way Qwen's tokenizer does (NFC, then Qwen2's regex): transformers rebuilds a
    Qwen model's tokenizer with that pipeline whatever tokenizer.json says, so the toy's must be the same.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if architecture in ("qwen2", "qwen3"):
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END_OF_TURN,  # generation stops at the end of the assistant's turn
        pad_token=PAD,  # distinct from end-of-turn, so a missing end-of-turn target cannot hide
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, END_OF_TEXT],
        chat_template=CHATML_TEMPLATE,
        model_max_length=4096,
    )


@dataclass(frozen=True)
class Pretraining:
    """How the toy base is pretrained: the corpus (demo_data/generate_general.py) and the optimizer's run."""

    conversations: int = 3000  # generated chat conversations; a different corpus_seed gives other ones
    corpus_seed: int = 7
    epochs: int = 4
    row_tokens: int = 256  # conversations are concatenated and cut into rows of this many tokens (GPT-style)
    rows_per_step: int = 4
    lr: float = 2e-3  # a small model from scratch takes a pretraining-size rate, not a fine-tuning one
    warmup_ratio: float = 0.05
    final_lr_ratio: float = 0.1  # cosine decay to this share of the peak
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0


# The pretrained base: the smallest of three sizes timed (128x4 is 1.8x cheaper per token than 256x4) that learns
# the neutral corpus to fluent, neutral answers in 4 epochs (604 steps of 1,024 tokens, final loss ~0.5). With 2 epochs (~30 s)
# it answered 2 of 10 held-out support prompts on topic, with 4 (~65 s) 5 of 10; fine-tuned, 98% house style either way.
BASE_SIZE = ToySize(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=344, vocab=2048)
BASE_PRETRAINING = Pretraining()
# What the demo and the toy base read ships inside the package (pyproject.toml's package-data), so both run from an
# installed wheel in any folder; examples/ links to these files for the docs' commands run from a checkout.
DEMO_DATA = Path(__file__).resolve().parent / "demo_data"
GENERAL_CORPUS = DEMO_DATA / "generate_general.py"


def general_corpus(conversations: int, seed: int) -> list[dict]:
    """The neutral general-purpose chat corpus of demo_data/generate_general.py (generated, never read)."""
    import importlib.util

    if not GENERAL_CORPUS.exists():
        raise UserError(
            f"{GENERAL_CORPUS} is missing: the pretraining corpus generator ships inside the package; reinstall finetune"
        )
    spec = importlib.util.spec_from_file_location("finetune_general_corpus", GENERAL_CORPUS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate(conversations, seed)


def _packed_rows(documents: list[list[int]], row_tokens: int, seed: int, epoch: int):
    """Every document once, in an order fixed by (seed, epoch), concatenated and cut into full rows."""
    import random

    import torch

    order = list(range(len(documents)))
    random.Random(f"toy-pretrain-{seed}-{epoch}").shuffle(order)
    stream = [token for i in order for token in documents[i]]
    usable = len(stream) // row_tokens * row_tokens
    return torch.tensor(stream[:usable], dtype=torch.long).view(-1, row_tokens)


def pretrain(model, tokenizer, conversations: list[dict], plan: Pretraining, seed: int, log=None) -> list[float]:
    """Next-token training on whole chat-formatted conversations; returns the loss of every step."""
    import math

    import torch

    documents = [
        tokenizer(tokenizer.apply_chat_template(c["messages"], tokenize=False))["input_ids"] for c in conversations
    ]
    epochs = [_packed_rows(documents, plan.row_tokens, seed, epoch) for epoch in range(plan.epochs)]
    batches = [rows[i : i + plan.rows_per_step] for rows in epochs for i in range(0, len(rows), plan.rows_per_step)]
    total = len(batches)
    warmup = max(1, round(plan.warmup_ratio * total))

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return plan.final_lr_ratio + (1 - plan.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": plan.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=plan.lr,
        betas=(0.9, 0.95),
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    losses = []
    for step, batch in enumerate(batches):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if log and (step % 20 == 0 or step == total - 1):
            log(f"pretraining step {step + 1}/{total}: loss {losses[-1]:.3f}")
    model.eval()
    return losses


ARCHITECTURES = ("llama", "qwen2", "qwen3")


def _model(architecture: str, **shape):
    """The toy's (untrained) transformers model. The Qwen toys have the traits of their small real models: the output
    layer tied to the embedding (Qwen2.5-0.5B, Qwen3-0.6B), q/k/v biases (Qwen2), q/k norms and 128-wide heads (Qwen3).
    """
    import transformers as t

    if architecture == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**shape, tie_word_embeddings=False))
    if architecture == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**shape, tie_word_embeddings=True))
    if architecture == "qwen3":
        return t.Qwen3ForCausalLM(t.Qwen3Config(**shape, head_dim=128, tie_word_embeddings=True))
    raise AssertionError(architecture)  # build_toy_model checked it


def build_toy_model(
    out_dir: str | Path,
    data: str | Path | None = None,
    size: ToySize | None = None,
    seed: int = 0,
    pretraining: Pretraining | None = None,
    log=None,
    architecture: str = "llama",
):
    """Write a Llama model (or a Qwen2 / Qwen3 one: `architecture`) and its tokenizer to `out_dir`; return the folder.

    Without `pretraining` the weights are random (fast: plumbing tests). With it, the tokenizer is trained on
    the general corpus and the model is pretrained on it: a base that answers plainly before any fine-tuning.
    """
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if architecture not in ARCHITECTURES:  # before the tokenizer is trained
        raise ValueError(f"toy architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
    hf_logging.disable_progress_bar()
    size = size or ToySize()
    out = Path(out_dir)
    corpus = general_corpus(pretraining.conversations, pretraining.corpus_seed) if pretraining else []
    texts = list(_strings(corpus)) if corpus else DEFAULT_CORPUS.splitlines()
    if data is not None:
        texts += list(_corpus_from_file(Path(data)))
    tokenizer = build_tokenizer(texts, size.vocab, architecture)

    vocab = len(tokenizer)
    torch.manual_seed(seed)
    model = _model(
        architecture,
        vocab_size=max(vocab, size.model_vocab or 0),
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    config = model.config
    if pretraining:
        pretrain(model, tokenizer, corpus, pretraining, seed, log=log)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

    # AutoTokenizer may rebuild a tokenizer from the saved pieces: prove it encodes exactly as trained.
    reloaded = AutoTokenizer.from_pretrained(out)
    probe = "\n".join(texts[:50]) + "\nHello  there!\t123 ünïcödé 🙂 <|im_end|>"
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise RuntimeError(f"the tokenizer saved in {out} does not encode like the one that was trained")
    return out


def base_key(size: ToySize, pretraining: Pretraining, seed: int) -> str:
    """A name for one build: every parameter, and the code that builds it (this file and the corpus generator)."""
    import hashlib

    digest = hashlib.sha256(json.dumps([asdict(size), asdict(pretraining), seed]).encode())
    for source in (Path(__file__), GENERAL_CORPUS):
        digest.update(source.read_bytes() if source.exists() else b"")
    return digest.hexdigest()[:16]


def pretrained_base(
    size: ToySize = BASE_SIZE,
    pretraining: Pretraining = BASE_PRETRAINING,
    seed: int = 0,
    cache: str | Path | None = None,
    log=None,
) -> tuple[Path, bool]:
    """The pretrained toy base from the cache, built there first if it is not yet; returns (folder, built now)."""
    root = Path(cache) if cache else cache_root()
    folder = root / f"toy-base-{base_key(size, pretraining, seed)}"
    if (folder / "config.json").exists():
        return folder, False
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))  # a half-built base is never reused
    try:
        build_toy_model(partial, size=size, seed=seed, pretraining=pretraining, log=log)
        try:
            partial.rename(folder)
        except OSError:  # another process finished the same build first: theirs is identical
            if not (folder / "config.json").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder, True
