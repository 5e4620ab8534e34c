"""The tokenizer in a GGUF file: tokens and their types, merges, special ids, the chat template, the pre-tokenizer.

    check_tokenizer(tokenizer_json, "runs/one")     byte-level BPE, or one sentence saying what it is instead
    add_tokenizer(writer, folder, vocab_size)       the `tokenizer.*` keys, as llama.cpp's converter writes them

Merges, special token ids and the chat template come from gguf's own `SpecialVocab`. The token list is built
the way llama.cpp's converter builds it (conversion/base.py get_vocab_base), not with gguf's `BpeVocab`: that
class marks every token of the base vocabulary NORMAL, and tokenizers such as the toy's and SmolLM2's keep
their special tokens (<|im_start|>, <|im_end|>) there: marked NORMAL, llama.cpp would cut them into pieces.
"""

from __future__ import annotations

from pathlib import Path

from finetune.data.tokenize import load_tokenizer
from finetune.settings.errors import UserError

# The pre-tokenizers llama.cpp knows by name (src/llama-vocab.cpp), as a transformers tokenizer.json spells them.
# A name is written only when the tokenizer.json matches one exactly; otherwise tokenizer.ggml.pre is left out.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT2_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}  # GPT-2's own regex
_PLAIN_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}  # after a Split


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


# name -> (pre-tokenizer steps, whether llama.cpp then ignores merges for whole words in the vocabulary)
KNOWN_PRE_TOKENIZERS = {
    "gpt-2": ([_GPT2_BYTES], False),
    "smollm": ([{"type": "Digits", "individual_digits": True}, _GPT2_BYTES], False),  # SmolLM, SmolLM2
    "qwen2": ([_split(_QWEN2_SPLIT), _PLAIN_BYTES], False),  # Qwen2, Qwen2.5, Qwen3
    "llama-bpe": ([_split(_LLAMA3_SPLIT), _PLAIN_BYTES], True),  # Llama 3
}


def _same(step: dict, known: dict) -> bool:
    return all(step.get(key) == value for key, value in known.items())


def pre_tokenizer_name(tokenizer_json: dict) -> str | None:
    """llama.cpp's name for this tokenizer's pre-tokenizer, when it is certainly that one; None otherwise.

    Qwen's NFC normalizer is allowed: llama.cpp normalizes nothing, which changes no NFC text (llama.cpp's own
    converter names Qwen's pre-tokenizer "qwen2" all the same).
    """
    if tokenizer_json.get("normalizer") not in (None, {"type": "NFC"}):
        return None
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    ignore_merges = bool(tokenizer_json.get("model", {}).get("ignore_merges"))
    for name, (known, ignores) in KNOWN_PRE_TOKENIZERS.items():
        if len(steps) == len(known) and all(map(_same, steps, known)) and ignore_merges == ignores:
            return name
    return None


def check_tokenizer(tokenizer_json: dict | None, where: str) -> None:
    """Byte-level BPE (GPT-2 style: SmolLM2, Llama 3, Qwen) is written; anything else is refused in one sentence."""
    if tokenizer_json is None:
        raise UserError(f"GGUF export needs the tokenizer.json (a fast tokenizer) of {where}, and there is none")
    model = tokenizer_json.get("model") or {}
    decoder = tokenizer_json.get("decoder") or {}
    if model.get("type") == "BPE" and not model.get("byte_fallback") and decoder.get("type") == "ByteLevel":
        return
    kind = model.get("type", "unknown")
    if model.get("byte_fallback"):
        kind = "SentencePiece-style BPE with byte fallback (Llama 2, Mistral v0.1-v0.3)"
    raise UserError(
        f"GGUF export does not support the tokenizer of {where} yet: it is {kind}, and only byte-level BPE "
        "tokenizers (GPT-2 style, as SmolLM2, Llama 3 and Qwen use) are written so far (docs/gguf.md)"
    )


def _looks_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")  # llama.cpp: does_token_look_special


def vocabulary(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Every row of the embedding as (token text, token type); rows past the tokenizer are UNUSED `[PAD<i>]`."""
    import gguf

    reverse = {index: token for token, index in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    if reverse and max(reverse) >= vocab_size:
        raise UserError(f"the tokenizer has ids up to {max(reverse)} but the model only {vocab_size} embedding rows")
    tokens, types = [], []
    for index in range(vocab_size):
        token = reverse.get(index)
        if token is None:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        if token in added:
            if not decoder[index].normalized:  # llama.cpp matches added tokens in the text as the text spells them
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            special = decoder[index].special or _looks_special(token)
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def _adds_special(tokenizer, which: str) -> bool:
    """Whether encoding a text adds the BOS (or EOS) token: llama.cpp must do the same, and not guess."""
    token_id = getattr(tokenizer, f"{which}_token_id")
    if token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0 if which == "bos" else -1] == token_id


def add_tokenizer(writer, folder: Path, vocab_size: int, end_of_turn: int | None) -> str | None:
    """Write the tokenizer of a transformers folder; returns the pre-tokenizer name written (None: left out)."""
    import json

    import gguf

    tokenizer = load_tokenizer(str(folder))
    # the pipeline transformers actually runs: for some models (Qwen) it rebuilds it whatever tokenizer.json says
    tokenizer_json = json.loads(tokenizer.backend_tokenizer.to_str())
    check_tokenizer(tokenizer_json, str(folder))
    tokens, types = vocabulary(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    pre = pre_tokenizer_name(tokenizer_json)
    if pre:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)

    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    special.add_special_token["bos"] = _adds_special(tokenizer, "bos")
    special.add_special_token["eos"] = _adds_special(tokenizer, "eos")
    special.add_to_gguf(writer, quiet=True)
    # the token the run learned to end a reply with, when it is not the EOS already (a base's <|endoftext|>)
    if end_of_turn is not None and end_of_turn != special.special_token_ids.get("eos"):
        writer.add_eot_token_id(end_of_turn)
    return pre
