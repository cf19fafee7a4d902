"""The package's one-way layout: data flows source -> config -> model -> capture -> report -> render, and no
module imports from a layer above its own, nor takes part in an import cycle. Every import counts: inside
functions, and under `if TYPE_CHECKING:` too (such an import never runs, but the module's signatures speak of
the other module's types, so it depends on it all the same). No module is named like a standard-library one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tfcli"
COMMANDS = ("tokens", "encode", "classify", "generate", "compare", "attribute", "patch", "heads")  # the core module of each command

# Each layer and the layers it may import from (besides itself), lowest first.
ALLOWED = {
    "errors": set(),
    "config": {"errors"},
    "model": {"errors", "config"},
    "checkpoints": {"errors", "config"},
    "sources": {"errors", "config", "checkpoints"},
    "tokenizer": {"errors", "sources"},
    "texts": {"errors", "tokenizer"},  # input texts, and a batch of them tokenized
    "api": {"errors", "config", "model", "checkpoints", "sources", "tokenizer"},
    "command": {"errors", "texts", "config", "model", "sources", "tokenizer", "api"},
    "render": {"errors", "command", "api", "tokenizer"},  # api: `tfcli config`'s core is api.describe
    "cli": {"errors", "texts", "command", "render", "sources", "api", "model", "tokenizer"},
    "package": {"cli"},
}


def layer(module: str) -> str:
    """tfcli.model.attention -> model, tfcli.encode -> command, tfcli.render.encode -> render, ..."""
    parts = module.split(".")
    if parts[-1] in ("tfcli", "__main__"):
        return "package"
    if parts[1] in COMMANDS:
        return "command"
    return parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("tfcli", *path.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The tfcli modules a file imports, anywhere in it (`from tfcli import encode` counts as tfcli.encode)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    # `tfcli` itself (its __init__) holds only the version and lazy names that import nothing at import time
    return {name for name in found if name in known and name != "tfcli"}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def test_every_module_has_a_layer():
    assert {layer(name) for name in graph()} <= set(ALLOWED)


def test_no_module_imports_from_a_layer_above_it():
    upward = [f"{source} imports {target}" for source, targets in graph().items() for target in targets
              if layer(target) != layer(source) and layer(target) not in ALLOWED[layer(source)]]
    assert upward == []


def test_no_import_cycle():
    edges = graph()
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for target in edges[module]:
            if target in path:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    done: set[str] = set()
    for module in edges:
        if module not in done:
            visit(module, [module])
    assert cycles == []


def test_the_checks_see_what_they_check():
    """The graph is not empty and knows the edges the flow is made of (so the checks above can fail)."""
    edges = graph()
    assert "tfcli.config" in edges["tfcli.sources"] and "tfcli.model.sites" in edges["tfcli.model.decoding"]
    assert "tfcli.encode" in edges["tfcli.cli"]  # imported inside the command function
    assert "tfcli.render.run_info" in edges["tfcli.render.figure"]  # imported under `if TYPE_CHECKING:`
    assert layer("tfcli.render.encode") == "render" and layer("tfcli.encode") == "command"


def test_no_module_is_named_like_a_standard_library_module():
    """A module named like one of the standard library's (`tokenize.py`, `html.py`) shadows it whenever its folder
    is first on sys.path (a script or a tool run from there), and makes readers wonder which one is meant."""
    named = [str(path.relative_to(ROOT)) for folder in ("tfcli", "tests", "benchmarks")
             for path in (ROOT / folder).rglob("*.py")
             if set(path.relative_to(ROOT / folder).with_suffix("").parts) & sys.stdlib_module_names]
    assert named == []
