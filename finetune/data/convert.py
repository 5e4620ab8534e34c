"""`finetune convert IN --out OUT.jsonl`: any format `finetune` reads, written as OpenAI chat JSONL.

What is written is exactly what would be trained: the same conversations, roles, weights, tool
calls (arguments as JSON strings, ids filled in) and tool schemas, one line per usable input line.
A file with errors is refused (every problem listed), and nothing the user has is overwritten.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from finetune.data.read import problems_text, read_file
from finetune.data.types import Conversation, Message
from finetune.settings.errors import UserError


def message_to_openai(message: Message) -> dict:
    item: dict = {"role": message.role}
    if message.content or not message.tool_calls:
        item["content"] = message.content
    if message.name:
        item["name"] = message.name
    if message.tool_calls:
        item["tool_calls"] = [call.to_dict() for call in message.tool_calls]
    if message.role == "tool" and message.tool_call_id:
        item["tool_call_id"] = message.tool_call_id
    if message.role == "assistant" and message.weight != 1:
        item["weight"] = int(message.weight) if message.weight == int(message.weight) else message.weight
    return item


def conversation_to_openai(conversation: Conversation) -> dict:
    """One line of OpenAI chat fine-tuning JSONL."""
    line: dict = {"messages": [message_to_openai(m) for m in conversation.messages]}
    if conversation.tools:
        line["tools"] = list(conversation.tools)
    if conversation.parallel_tool_calls is not None:
        line["parallel_tool_calls"] = conversation.parallel_tool_calls
    return line


def run_convert(source: str, out: str, format: str | None = None) -> int:
    """The `finetune convert` command: 0 when OUT is written, UserError otherwise."""
    target = Path(out)
    if target.exists():
        raise UserError(f"{out} already exists; choose another --out (finetune never overwrites your files)")
    parsed = read_file(source, format)
    if not parsed.ok:
        raise UserError(problems_text(parsed))
    if not parsed.conversations:
        raise UserError(f"{source}: no conversation to convert")
    partial = None
    try:
        # a name of our own next to OUT (never a file of the user's, such as OUT.partial), renamed when complete
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        partial = Path(name)
        with open(fd, "w", encoding="utf-8") as handle:
            for conversation in parsed.conversations:
                handle.write(json.dumps(conversation_to_openai(conversation), ensure_ascii=False) + "\n")
        partial.chmod(0o666 & ~_umask())  # mkstemp makes it private; OUT gets the mode any new file gets
        os.replace(partial, target)
    except OSError as exc:
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise UserError(f"{out}: cannot write it ({exc.strerror or exc})") from None
    print(f"format: {parsed.format}")
    print(f"wrote {len(parsed.conversations):,} conversation(s) as OpenAI chat JSONL to {out}")
    return 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
