"""The package's folders are its layers, bottom to top; a module imports only from its own layer or the ones below.

    settings   RunConfig and the setting registry, wording, errors, fingerprint, version, the cache root
    bucket     where a run's files live by URI: a local folder or s3://bucket/prefix (fsspec + s3fs)
    track      the trackers a run reports to (a leaf the spine calls)
    rules      pure arithmetic and Auto: steps, Auto's values, memory, cost (no data, no torch)
    models     where a model comes from (hub, folder, GGUF, pulled bases) and its facts from headers
    data       files -> validated conversations -> tokenized records (no torch)
    plan       RunConfig + the data's numbers -> Plan (no torch)
    report     metrics -> diagnosis, curves, report.json
    placement  loading, placing and generating: every model of a run on its device and precision, the one decoder
    train      model, batches, loss, the loop, checkpoints, devices, launchers
    ship       what uses a trained run: eval, export, serving, run folders, the toy model
    run        the spine (run.py): a run, top to bottom
    service    the job service, itself layered: storage < workers < api < dashboard < its command line
    commands   the command line: the parser and one module per command; nothing imports it
    public     the package's public paths (`import finetune`, `finetune.serving`, `python -m finetune`)

Every import counts, those inside functions too: an import inside a function is kept only where an optional or
heavy dependency is the reason, and a comment on its line (or the line above) says so. No import circles.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "finetune"
LAYERS = (
    ("settings",),
    ("bucket",),
    ("track",),
    ("rules",),
    ("models",),
    ("data",),
    ("plan",),
    ("report",),
    ("placement",),
    ("train",),
    ("ship",),
    ("run",),
    ("service",),  # its own modules (options, logs) sit under its layers
    ("service.storage",),
    ("service.workers",),
    ("service.api",),
    ("service.dashboard",),
    ("service.cli",),
    ("commands",),
    ("__init__", "__main__", "serving"),
)
NAMES = [
    "settings", "bucket", "track", "rules", "models", "data", "plan", "report", "placement", "train", "ship", "run",
    "service", "service storage", "service workers", "service api", "dashboard", "service cli", "commands", "public",
]  # fmt: skip


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


MODULES = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    """The layer of `finetune.<module>` (dotted, without the package name): the longest matching prefix wins."""
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"finetune.{module} belongs to no layer: add its folder to LAYERS"
    return best[0]


def _resolve(name: str) -> str | None:
    """The finetune module an imported name lives in (`finetune.data.read.read_file` -> `data.read`)."""
    name = name.removeprefix("finetune.") if name != "finetune" else "__init__"
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, ast.stmt, bool]]:
    """(imported module, the import statement, inside a function) for every import of finetune in `module`."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names: list[str] = []
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package
                    for _ in range(child.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = "finetune." + anchor + ("." + base if base else "")
                names = [f"{base}.{alias.name}" for alias in child.names] if base.startswith("finetune") else []
            elif isinstance(child, ast.Import):
                names = [alias.name for alias in child.names if alias.name.startswith("finetune")]
            for name in names:
                target = _resolve(name)
                if target and target != module:
                    found.append((target, child, inner))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def test_every_folder_is_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_runs_against_the_layering():
    wrong = sorted(
        {
            f"{module} ({NAMES[_layer(module)]}) imports {target} ({NAMES[_layer(target)]})"
            for module in MODULES
            for target, _, _ in _imports(module)
            if _layer(target) > _layer(module)
        }
    )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_circles():
    graph = {module: {target for target, _, _ in _imports(module)} for module in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def strong(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                strong(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            strong(node)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_an_import_inside_a_function_says_why():
    """A lazy import of finetune is kept only for a heavy or optional dependency, named in a comment."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for target, statement, in_function in _imports(module):
            if not in_function:
                continue
            around = lines[statement.lineno - 2 : statement.end_lineno]
            if not any("#" in line for line in around):
                silent.append(f"{module}:{statement.lineno} imports {target}")
    assert not silent, "imports inside functions without a reason:\n" + "\n".join(sorted(set(silent)))


# Python that ships as data, not as a module of the layers: the toy base's corpus generator, loaded by importlib from
# its file (never imported) and digested byte for byte into the toy base's cache key, so it is not split
SHIPPED_AS_DATA = {PACKAGE / "ship" / "demo_data" / "generate_general.py"}


def test_no_module_is_over_450_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if p not in SHIPPED_AS_DATA and (n := len(p.read_text(encoding="utf-8").splitlines())) > 450
    }
    assert not long, f"modules over 450 lines (split them by job): {long}"


def test_no_function_is_over_80_lines():
    long = [
        f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, "functions over 80 lines (split them into named steps):\n" + "\n".join(sorted(long))
