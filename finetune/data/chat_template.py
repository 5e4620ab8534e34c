"""Which chat template renders a run's conversations (`--chat-template auto|chatml|FILE`), and why.

auto: the model's own template; ChatML when it has none (a base model, as many GGUFs and hub folders are).
ChatML's two special tokens are added where the vocabulary lacks them, as TRL's chat-format set-up does;
load_model grows the embeddings to match and the run trains and saves the new rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.data.template_sandbox import install
from finetune.models.bases import converted
from finetune.models.gguf import read_header
from finetune.models.known_bases import find_base
from finetune.models.source import local_model
from finetune.settings.errors import UserError
from finetune.settings.wording import ref

CHATML = "chatml"
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


# ChatML, as used by Qwen and many others (the toy model's own template too). The end-of-turn token closes every
# message. Tools the way Qwen2.5 / Hermes templates do it: the schemas in the system turn inside <tools></tools>,
# each call as a JSON object inside <tool_call></tool_call> after the reply's content, and the results as a user
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
CHATML_TEMPLATE = (
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


def chatml_template() -> str:
    return CHATML_TEMPLATE


def use_chat_template(tokenizer, setting: str = "auto", model: str | None = None):
    """Give `tokenizer` the chat template the `--chat-template` setting names, checked (`check_template`), and
    return it.

    auto: the model's own template; ChatML when it has none (a base model). chatml: ChatML. Otherwise a path
    to a Jinja file. ChatML's two special tokens are added where the vocabulary lacks them, as TRL's chat-format
    set-up does (load_model then grows the embeddings to match; the end of turn is `<|im_end|>`).
    """
    if setting == "auto":
        if getattr(tokenizer, "chat_template", None):
            check_template(tokenizer, own_template_source(model))
            return tokenizer
        setting = CHATML
    if setting == CHATML:
        vocabulary = tokenizer.get_vocab()
        missing = [token for token in CHATML_TOKENS if token not in vocabulary]
        if missing:
            tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
        tokenizer.chat_template = chatml_template()
        return tokenizer
    tokenizer.chat_template = read_template_file(setting)
    check_template(tokenizer, ref("chat_template", setting))
    return tokenizer


def read_template_file(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(
            f"{ref('chat_template', path)}: not auto, chatml or a readable Jinja file ({exc.__class__.__name__})"
        ) from None
    if not text.strip():
        raise UserError(f"{ref('chat_template', path)}: the file is empty")
    return text


def has_own_template(model: str) -> bool | None:
    """Whether a model's tokenizer carries a chat template, read from its files without loading it; None when
    that cannot be told here (a hub id that is not in the local cache)."""
    path = Path(model).expanduser()
    if path.is_file() and path.name.lower().endswith(".gguf"):
        return read_header(path).chat_template is not None
    if not path.is_dir():
        base = find_base(model)
        path = converted(base) if base is not None else None
        if path is None:
            return _hub_template(model)
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return bool(config.get("chat_template")) if isinstance(config, dict) else None


def _hub_template(model: str) -> bool | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        for name in ("chat_template.jinja", "tokenizer_config.json"):
            cached = try_to_load_from_cache(model, name)
            if isinstance(cached, str):
                return has_own_template(str(Path(cached).parent))
    except Exception:  # not a hub id, or no cache: unknown
        return None
    return None


def describe_chat_template(model: str | None, setting: str = "auto") -> tuple[str, str | None]:
    """(the template a run uses, Auto's reason when the setting is auto): "model" (its own), "chatml", or the
    Jinja file's path; for the plan, which says which template is used and why."""
    if setting != "auto":
        if setting != CHATML:
            read_template_file(setting)  # a bad path fails at plan time, not after the data is read
        return setting, None
    if not model:
        return "auto", None
    own = has_own_template(model)
    if own:
        return "model", "auto: the model's tokenizer carries a chat template, and the data is rendered with it"
    if own is None:
        return "auto", (
            "auto: the model's own chat template, or ChatML when it has none (known once its tokenizer loads)"
        )
    return CHATML, (
        "auto: the model has no chat template (a base model), so ChatML, the documented default: "
        "<|im_start|>/<|im_end|> added as special tokens where missing (the embeddings grow to match), "
        "<|im_end|> ends each turn"
    )


def own_template_source(model: str | None) -> str:
    """Where a model's own chat template comes from, for a message: its chat_template.jinja, its
    tokenizer_config.json, or a GGUF's metadata."""
    if not model:
        return "the model's chat template"
    if model.lower().endswith(".gguf"):
        return f"the chat template in {model}'s metadata (tokenizer.chat_template)"
    folder = Path(model).expanduser()
    if not folder.is_dir():
        try:
            folder = Path(local_model(model))  # a pulled base's name: its folder
        except Exception:  # a hub id not fetched, or a base not pulled: only the name is known
            folder = None
    if folder is not None and (folder / "chat_template.jinja").is_file():
        return f"the chat template in {model}'s chat_template.jinja"
    return f"the chat template in {model}'s tokenizer_config.json"


def check_template(tokenizer, source: str) -> None:
    """Render a plain conversation (a user message, then an assistant reply) once, before any data is, so that a
    template Jinja cannot compile, that its sandbox refuses, that goes over its budget of work or size
    (data/template_sandbox.py), that fails on it or that leaves its messages out fails here in one sentence naming
    `source`. Such a template can render no record: tokenizing learns where a reply ends from this very
    conversation. One that refuses other conversations on its own terms (`raise_exception` on a role it does not
    know) is left to the paths that render data, which say so per record."""
    from jinja2.exceptions import SecurityError, TemplateSyntaxError

    install()
    tokenizer.finetune_template_source = source  # for a record that takes it over its budget (ChatTokenizer)
    probe = [{"role": "user", "content": PROBE_QUESTION}, {"role": "assistant", "content": PROBE_ANSWER}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False)
    except TemplateSyntaxError as exc:
        raise UserError(f"{source}: not a valid Jinja template: line {exc.lineno}: {_one_line(exc.message)}") from None
    except SecurityError as exc:  # the sandbox's refusals, and TemplateLimitError
        raise UserError(f"{source}: the chat template was refused: {_one_line(str(exc))}") from None
    except (OverflowError, RecursionError, MemoryError) as exc:  # range() past the sandbox's limit; deep macros
        problem = _one_line(str(exc)) or "it recursed too deep"
        raise UserError(f"{source}: the chat template was refused: {problem}") from None
    except Exception as exc:  # {{ 1/0 }}, raise_exception('...'), an undefined attribute: no record would render
        raise UserError(f"{source}: the chat template fails on {PLAIN}: {_failure(exc)}") from None
    left_out = [what for what, content in (("the user's message", PROBE_QUESTION),
                                           ("the assistant's reply", PROBE_ANSWER)) if content not in text]  # fmt: skip
    if left_out:
        what = "renders no message" if len(left_out) == 2 else f"leaves out {left_out[0]}"
        raise UserError(f"{source}: the chat template {what} of {PLAIN}")


PROBE_QUESTION, PROBE_ANSWER = "Where is my order?", "It ships today."
PLAIN = "a plain conversation (a user message, then an assistant reply)"


def _failure(exc: Exception) -> str:
    """A template's failure in a few words: its own, when it raised one (raise_exception), else the error's."""
    from jinja2.exceptions import TemplateError

    said = _one_line(str(exc))
    if type(exc) is TemplateError:  # what transformers' raise_exception('...') raises: the template's own words
        return f"it raised {said!r}"
    return f"{said or 'an error'} ({type(exc).__name__})"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).rstrip(".")
