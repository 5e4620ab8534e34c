"""The package's layers: a module imports only from its own layer or the ones below it (lazy imports included).

    base      the vocabulary every layer speaks: errors, settings and their wording, RunConfig, the data types
    rules     where a model comes from (a folder, a GGUF file, a pulled base) and its facts; the plan's pure
              rules the data path also needs: Auto's choices, memory, arithmetic
    data      files -> validated conversations -> tokenized records (no torch)
    plan      RunConfig + the data's numbers -> Plan (no torch)
    report    metrics -> diagnosis, curves, report.json
    train     model, batches, loss, the loop, checkpoints, devices
    ship      what uses a trained run: eval, export, run folders, serving, chat, the toy model builder
    run       the spine: a run, top to bottom
    commands  the command line, the service, the demo, and each package's `command` module (an entry point)

So the loop never reaches up into evaluation or export, and the data path never into training.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "finetune"
LAYERS = [
    (
        "base",
        ("errors", "settings", "wording", "version", "config", "fingerprint", "data.types", "track")
        + ("caches", "manifest"),
    ),
    (
        "rules",
        ("model_source", "gguf_model", "bases")
        + tuple(f"plan.{m}" for m in ("auto", "memory", "model_facts", "arithmetic", "cost", "preference")),
    ),
    ("data", ("data", "prompting")),
    ("plan", ("plan",)),
    ("report", ("report",)),
    ("train", ("train",)),
    ("ship", ("eval", "export", "run_folder", "serving", "chat", "toy")),
    ("run", ("run",)),
    ("commands", ("cli", "flags", "__main__", "__init__", "service", "demo")),
]


def _layer(module: str) -> int:
    """The layer of `finetune.<module>` (dotted, without the package name): the most specific prefix wins."""
    if module.split(".")[-1] == "command":
        return len(LAYERS) - 1
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"finetune.{module} belongs to no layer: add it to LAYERS"
    return best[0]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        found |= {name.removeprefix("finetune.") for name in names if name.startswith("finetune.")}
    return found


def test_no_import_runs_against_the_layering():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for imported in _imports(path):
            if _layer(imported) > _layer(module):
                wrong.append(
                    f"{module} ({LAYERS[_layer(module)][0]}) imports {imported} ({LAYERS[_layer(imported)][0]})"
                )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_module_is_over_450_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450
    }
    assert not long, f"modules over 450 lines (split them by job): {long}"
