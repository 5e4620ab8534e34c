"""What the documentation names that must exist in the code: `finetune` commands and their flags, setting keys,
API hyperparameters and HTTP routes. tests/unit/test_docs_names.py checks each against the code.

Commands and settings are read from code only (fenced blocks and `inline spans`). A flag in code counts when it
follows `finetune COMMAND` on the same command line (it must be that command's: torchrun's, pip's or ray's flags on
that line, before `finetune`, do not count), or when a span is the flag alone (`--max-seq-len`); a flag in prose
counts too (it must be some command's). Routes (`GET /v1/files`) count anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mention:
    file: str
    line: int
    kind: str  # "command", "flag", "setting", "hyperparameter", "route"
    name: str  # "finetune serve purge", "--max-seq-len", "max_seq_len", "n_epochs", "GET /v1/files/{file_id}"
    command: tuple[str, ...] = ()  # a flag's command ("serve", "purge"); () for a span that is a flag alone

    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Code:
    """A fenced block (its language) or an inline span (language None), and the line it starts on."""

    text: str
    line: int
    language: str | None


FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SPAN = re.compile(r"(`+)(.+?)\1")
ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE)\s+(/[\w{}<>./:-]*)")
# a command starts its line (after VAR=value assignments), or follows && ; | $( or `-m` (python -m, torchrun -m)
FINETUNE = re.compile(r"(?:^(?:\w+=\S*\s+)*|&&\s*|;\s*|\|\s*|\$\(\s*|\s-m\s+)finetune\s+([a-z][a-z-]*)(?=\s|$)")
COMMENT = re.compile(r"(?:^|\s)#.*$")
FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*")
# where a `finetune ...` command ends on its line: a comment, && ; ||, a pipe into another program, $( ... )'s end
COMMAND_END = re.compile(r"\s#|&&|;|\|\||\|\s+(?![-\[])|\)\s|\)$|`")
YAML_KEY = re.compile(r"^([A-Za-z_][\w-]*):(?:\s|$)", re.MULTILINE)
RUN_CONFIG = re.compile(r"RunConfig\(([^)]*)\)")
KEYWORD = re.compile(r"(\w+)\s*=")
DOTTED_HYPERPARAMETER = re.compile(r"hyperparameters\.(\w+)")
HYPERPARAMETER_OBJECT = re.compile(r"""["']?hyperparameters["']?\s*[:=]\s*\{([^{}]*)\}""")
QUOTED_KEY = re.compile(r"""["'](\w+)["']\s*:""")


PROSE_FLAG = re.compile(r"(?<![\w`/-])--[a-z][a-z0-9-]*")


def code_of(text: str) -> Iterator[Code]:
    """Fenced blocks, then the inline spans of the lines outside them."""
    fence, block, language, start = None, [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence, block, language, start = opened.group(1), [], opened.group(2) or "", number + 1
        elif fence is not None and line.strip().startswith(fence):
            yield Code("\n".join(block), start, language)
            fence = None
        elif fence is not None:
            block.append(line)
        else:
            yield from (Code(span.group(2), number, None) for span in SPAN.finditer(line))


def command_lines(code: Code) -> Iterator[tuple[int, str]]:
    """Each logical line of a block: a line ending in a backslash, or followed by an indented line that starts with
    `[` or `--` (a synopsis wrapped by hand), continues on the next."""
    lines = code.text.splitlines()
    i = 0
    while i < len(lines):
        start, joined = i, lines[i]
        while i + 1 < len(lines) and (joined.endswith("\\") or re.match(r"\s+(\[|--)", lines[i + 1])):
            i += 1
            joined = joined.rstrip("\\") + " " + lines[i].strip()
        yield code.line + start, (COMMENT.sub("", joined) if code.language is not None else joined).strip()
        i += 1


def _commands(file: str, line: int, text: str, tree: dict) -> Iterator[Mention]:
    """`finetune COMMAND [SUBCOMMAND ...] ... --flag ...` on one line; `tree` maps each command's words to its
    subcommands' names (the parser's), so `finetune serve purge --dry-run` is the flag of `serve purge`."""
    for found in FINETUNE.finditer(text):
        rest = text[found.start(1) :]
        end = COMMAND_END.search(rest)
        tokens = (rest[: end.start()] if end else rest).replace("[", " ").replace("]", " ").split()
        words: tuple[str, ...] = ()
        for token in tokens:
            if not words:
                words = (token,)
                yield Mention(file, line, "command", "finetune " + token)
                if token not in tree[()]:
                    break
            elif token in tree.get(words, ()):
                words += (token,)
            elif flag := FLAG.match(token):
                yield Mention(file, line, "flag", flag.group(0), words)


def _settings(file: str, code: Code) -> Iterator[Mention]:
    is_yaml = code.language in ("yaml", "yml")
    if is_yaml and not re.search(r"^apiVersion:", code.text, re.MULTILINE):  # a Kubernetes manifest is not a config
        for key in YAML_KEY.finditer(code.text):
            yield Mention(file, code.line + code.text[: key.start()].count("\n"), "setting", key.group(1))
    if code.language is None and (span := re.fullmatch(r"([a-z_]+):", code.text.strip())):
        yield Mention(file, code.line, "setting", span.group(1))  # `cache_dir:` in a sentence: a YAML key
    for call in RUN_CONFIG.finditer(code.text):
        line = code.line + code.text[: call.start()].count("\n")
        yield from (Mention(file, line, "setting", k.group(1)) for k in KEYWORD.finditer(call.group(1)))


def _hyperparameters(file: str, code: Code) -> Iterator[Mention]:
    for dotted in DOTTED_HYPERPARAMETER.finditer(code.text):
        yield Mention(file, code.line + code.text[: dotted.start()].count("\n"), "hyperparameter", dotted.group(1))
    for obj in HYPERPARAMETER_OBJECT.finditer(code.text):
        line = code.line + code.text[: obj.start()].count("\n")
        yield from (Mention(file, line, "hyperparameter", k.group(1)) for k in QUOTED_KEY.finditer(obj.group(1)))


def _routes(file: str, text: str) -> Iterator[Mention]:
    for number, line in enumerate(text.splitlines(), 1):
        for found in ROUTE.finditer(line):
            path = found.group(2).rstrip(".:")
            if "..." not in path:  # `GET .../events`: elided on purpose
                yield Mention(file, number, "route", f"{found.group(1)} {path}")


def _prose_flags(file: str, text: str) -> Iterator[Mention]:
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if opened and (fence is None or line.strip().startswith(fence)):
            fence = opened.group(1) if fence is None else None
        elif fence is None:
            prose = SPAN.sub(" ", line)
            yield from (Mention(file, number, "flag", flag.group(0)) for flag in PROSE_FLAG.finditer(prose))


def mentions(path: Path, root: Path, tree: dict) -> list[Mention]:
    """Every mention in one Markdown file (`root`: what its name is shown relative to)."""
    text = path.read_text(encoding="utf-8")
    file = str(path.relative_to(root))
    found: list[Mention] = [*_routes(file, text), *_prose_flags(file, text)]
    for code in code_of(text):
        for line, command_line in command_lines(code):
            found += _commands(file, line, command_line, tree)
        if code.language is None and (flag := FLAG.match(code.text)):
            found.append(Mention(file, code.line, "flag", flag.group(0)))
        found += _settings(file, code)
        found += _hyperparameters(file, code)
    return found
