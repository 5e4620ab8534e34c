"""Build a tiny Llama-architecture causal LM and a real byte-level BPE tokenizer, offline, in seconds.

    finetune toy-model DIR [--data FILE]

The folder is written with `save_pretrained` and loads back through `AutoModelForCausalLM` /
`AutoTokenizer` exactly like a model from a hub: the demo and the tests use nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

IM_START = "<|im_start|>"
END_OF_TURN = "<|im_end|>"
PAD = "<|pad|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, END_OF_TEXT, IM_START, END_OF_TURN]

# ChatML, as used by Qwen and many others. The end-of-turn token closes every message. Tools the way
# Qwen2.5 / Hermes templates do it: the schemas in the system turn inside <tools></tools>, each call as
# a JSON object inside <tool_call></tool_call> after the reply's content, and the results as a user
# turn of <tool_response></tool_response> blocks. Without tools the output is plain ChatML.
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FORMAT = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' }}"
    "{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '" + TOOLS_FORMAT.replace("\n", "\\n") + "<|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\n' }}{%- endif %}"
    "{{- '<tool_call>\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{- call['arguments'] }}{%- else %}{{- call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

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


def build_tokenizer(texts: list[str], vocab_size: int):
    """Train a GPT-2-style byte-level BPE and wrap it as a transformers fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
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
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_toy_model(out_dir: str | Path, data: str | Path | None = None, size: ToySize | None = None, seed: int = 0):
    """Write a random-init Llama model and its tokenizer to `out_dir`; return the folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    size = size or ToySize()
    out = Path(out_dir)
    texts = DEFAULT_CORPUS.splitlines()
    if data is not None:
        texts += list(_corpus_from_file(Path(data)))
    tokenizer = build_tokenizer(texts, size.vocab)

    vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=max(vocab, size.model_vocab or 0),
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
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
