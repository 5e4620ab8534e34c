"""`finetune validate` for a preference file: every problem with its line and stable code, then the counts."""

from __future__ import annotations

import json
import sys

from finetune.data.preference import FORMAT_NAMES, read_preferences
from finetune.data.sensitive import scanned_file
from finetune.settings.wording import render, rendered


def run_validate_preferences(path: str, as_json: bool = False, sensitive_data: str = "warn") -> int:
    """Print the report; 0 when the file is usable, 1 when not."""
    parsed, found = scanned_file(read_preferences(path), sensitive_data)  # sensitive.py: one problem when any
    prompts = len({p.prompt_conversation().key() for p in parsed.pairs})
    stats = {"format": parsed.format, "pairs": len(parsed.pairs), "prompts": prompts}
    if as_json:
        document = {
            "ok": parsed.ok,
            "errors": [p.to_dict() for p in parsed.errors],
            "warnings": [p.to_dict() for p in parsed.warnings],
            "stats": stats,
        } | ({"sensitive_data": found} if found["total"] else {})
        print(json.dumps(rendered(document), ensure_ascii=True))
        return 0 if parsed.ok else 1
    out = sys.stdout
    for title, problems in (("errors", parsed.errors), ("warnings", parsed.warnings)):
        if problems:
            print(f"{title} ({len(problems)}):", file=out)
        for p in problems:
            where = f"{path}:{p.line}" if p.line else path
            print(f"  {where} [{p.code}] {render(p.message)}", file=out)
    kind = FORMAT_NAMES.get(parsed.format or "", "unknown format")
    counted = f"{len(parsed.pairs)} pairs over {prompts} prompts, {kind}"
    print(f"OK: {path} is usable ({counted})" if parsed.ok else f"NOT USABLE: {path} ({counted}); fix the errors above")
    return 0 if parsed.ok else 1
