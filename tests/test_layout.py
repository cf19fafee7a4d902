"""The package's one-way layout: data flows source -> config -> model -> capture -> report -> render, and no
module imports from a layer above its own, nor takes part in an import cycle. Every import counts: inside
functions, and under `if TYPE_CHECKING:` too (such an import never runs, but the module's signatures speak of
the other module's types, so it depends on it all the same). No module is named like a standard-library one.

Each command is one package, `tfcli/commands/<command>/`, holding its three layers by module name: its core
(`core.py` and any other module: its file formats, its engines), its renderer (`render.py`, and `render_*.py`
helpers) and its command line (`cli.py`). No module of a command imports another command's: what two commands
share lives in `analysis/` (or below), and everything there is shared."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tfcli"

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
    # what analyses share: the metric, inputs, site names and kinds, the residual algebra
    "analysis": {"errors", "config", "model", "tokenizer"},
    "command": {"errors", "texts", "config", "model", "sources", "tokenizer", "api", "analysis"},
    "render": {"errors", "command", "api", "tokenizer", "analysis"},  # api: `tfcli config`'s core is api.describe
    # --ray: workers that build the model and run the work function a command's CLI hands them (knows no command)
    "cluster": {"errors", "api", "sources"},
    # one runner for every analysis over a dataset, here or on the cluster (knows no command: the CLI hands it one)
    "runner": {"errors", "texts", "config", "model", "tokenizer", "analysis", "cluster"},
    "cli": {"errors", "texts", "command", "render", "sources", "api", "model", "tokenizer", "analysis", "cluster",
            "runner"},
    "package": {"cli"},
}


def layer(module: str) -> str:
    """tfcli.model.attention -> model, tfcli.commands.encode.core -> command, tfcli.commands.patch.results ->
    command, tfcli.commands.encode.render -> render, tfcli.commands.patch.render_grids -> render,
    tfcli.commands.encode.cli -> cli, ..."""
    parts = module.split(".")
    if parts[-1] in ("tfcli", "__main__"):
        return "package"
    if parts[1] == "commands":
        name = parts[3] if len(parts) > 3 else ""
        return "cli" if name == "cli" else "render" if name == "render" or name.startswith("render_") else "command"
    return parts[1]


def command_of(module: str) -> str | None:
    """tfcli.commands.patch.results -> patch; None outside tfcli/commands/."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "commands" else None


# every command's package (tfcli/commands/config/ renders `tfcli config`, whose core is api.describe)
COMMANDS = {path.parent.name for path in (PACKAGE / "commands").glob("*/__init__.py")}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("tfcli", *path.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The tfcli modules a file imports, anywhere in it (`from tfcli import encode` counts as
    tfcli.commands.encode.core)."""
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


def test_commands_are_leaves():
    """No module of a command (core, renderer or command line) imports another command's: what two commands share
    lives in `analysis/` (or below). The modules of one command's package import each other. Only `tfcli/cli/`'s
    `__init__` imports every command's `cli`, which registers it."""
    crossing = [f"{source} imports {target}" for source, targets in graph().items() for target in targets
                if command_of(target) and command_of(source) != command_of(target) and source != "tfcli.cli"]
    assert crossing == []


def test_analysis_holds_only_what_two_commands_share():
    """A module of `analysis/` is used by two commands or more (or by the runner, the model or another shared
    module): a module only one command uses belongs in that command's package."""
    edges = graph()
    users = {name: set() for name in edges if name.startswith("tfcli.analysis.")}
    for source, targets in edges.items():
        for target in targets & set(users):
            users[target].add(command_of(source) or source)
    alone = [f"{name}: only {sorted(who)}" for name, who in users.items() if len(who) < 2]
    assert alone == []


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
    assert {"tokens", "encode", "classify", "generate", "compare", "attribute", "patch", "heads", "sae",
            "task"} <= COMMANDS
    edges = graph()
    assert "tfcli.config" in edges["tfcli.sources"] and "tfcli.model.sites" in edges["tfcli.model.decoding"]
    assert "tfcli.commands.encode.core" in edges["tfcli.commands.encode.cli"]  # imported inside the command function
    assert "tfcli.render.run_info" in edges["tfcli.render.figure"]  # imported under `if TYPE_CHECKING:`
    assert layer("tfcli.commands.encode.render") == "render" and layer("tfcli.commands.encode.core") == "command"
    assert layer("tfcli.commands.patch.render_grids") == "render" and layer("tfcli.commands.patch.cli") == "cli"
    assert "tfcli.commands.patch.results" in edges["tfcli.commands.patch.core"]
    assert layer("tfcli.commands.patch.results") == "command" and command_of("tfcli.commands.patch.results") == "patch"


def test_no_module_is_named_like_a_standard_library_module():
    """A module named like one of the standard library's (`tokenize.py`, `html.py`) shadows it whenever its folder
    is first on sys.path (a script or a tool run from there), and makes readers wonder which one is meant."""
    named = [str(path.relative_to(ROOT)) for folder in ("tfcli", "tests", "benchmarks")
             for path in (ROOT / folder).rglob("*.py")
             if set(path.relative_to(ROOT / folder).with_suffix("").parts) & sys.stdlib_module_names]
    assert named == []


def command_functions(path: Path) -> list[tuple[ast.FunctionDef, set[str], bool]]:
    """The commands a CLI module declares (functions decorated with `@<app>.command(...)`): each with the command
    cores it imports and whether it takes --report (`@shared_options` without `without=(..., "report", ...)`)."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
                for d in node.decorator_list):
            cores = {name for name in function_imports(node) if layer(name) == "command"}
            shared = [d for d in node.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
                      and d.func.id == "shared_options"]
            report = any("report" not in next((ast.literal_eval(k.value) for k in d.keywords if k.arg == "without"),
                                              ()) for d in shared)
            found.append((node, cores, report))
    return found


def function_imports(node: ast.AST) -> set[str]:
    """The tfcli modules imported inside `node` (`from tfcli import patch as core` counts as
    tfcli.commands.patch.core)."""
    found = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
            found |= {inner.module} | {f"{inner.module}.{alias.name}" for alias in inner.names}
        elif isinstance(inner, ast.Import):
            found |= {alias.name for alias in inner.names}
    return {name for name in found if name in modules() and name != "tfcli"}


CLI_MODULES = sorted((PACKAGE / "commands").glob("*/cli.py"))


def test_every_command_is_one_package_and_the_shared_command_line_knows_none():
    """Each command's package declares its command(s) in its `cli.py`; the shared modules of `tfcli/cli/` (the app,
    options, session, output) import no command's module, but `__init__`, which imports every `cli.py` (one line
    per command registers it)."""
    assert len(CLI_MODULES) == len(COMMANDS) and all(command_functions(path) for path in CLI_MODULES)
    knowing = [f"{source} imports {target}" for source, targets in graph().items() for target in targets
               if source.startswith("tfcli.cli.") and command_of(target)]
    assert knowing == []
    registered = {target for target in graph()["tfcli.cli"] if command_of(target)}
    assert registered == {f"tfcli.commands.{command}.cli" for command in COMMANDS}


def test_no_module_is_long_and_each_renderer_holds_its_report():
    """No module of the package passes 600 lines (a command's package grows another module instead), and the
    renderer of every command that takes --report holds its page section and its figure: `page_section` and
    `figure`, which the page and the figure find by the command's name (`tfcli.commands.<command>.render`)."""
    too_long = [f"{path.relative_to(ROOT)}: {count} lines" for path in sorted(PACKAGE.rglob("*.py"))
                if (count := len(path.read_text(encoding="utf-8").splitlines())) > 600]
    assert too_long == []
    reporting = {command_of(core) for path in CLI_MODULES
                 for _, cores, report in command_functions(path) if report for core in cores}
    assert {"encode", "classify", "generate", "attribute", "patch", "heads", "steer"} <= reporting
    missing = []
    for command in sorted(reporting):
        path = PACKAGE / "commands" / command / "render.py"
        defined = {node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
                   if isinstance(node, ast.FunctionDef)}
        missing += [f"{command}/render.py: {name}" for name in ("page_section", "figure") if name not in defined]
        if "dataset_lines" in defined:  # a view of a dataset's aggregate: its own page and figure
            missing += [f"{command}/render.py: {name}" for name in ("dataset_page_section", "dataset_figure")
                        if name not in defined]
    assert missing == []


def test_the_options_every_command_shares_are_declared_once():
    """--model, --device, --json, --report and the rest, and --dataset with the options that go with it, come to a
    command from `@shared_options` (tfcli/cli/options.py), never declared again in its signature."""
    from tfcli.cli.options import DATASET, SHARED

    again = [f"{path.parent.name}/cli.py: {node.name} declares {arg.arg}" for path in CLI_MODULES
             for node, _, _ in command_functions(path)
             for arg in node.args.args + node.args.kwonlyargs if arg.arg in SHARED | DATASET]
    assert again == []
    every = [node.name for path in CLI_MODULES for node, _, _ in command_functions(path)]
    assert len(every) >= 12 and "heads" in every  # the check sees the commands


def test_no_function_takes_more_than_eight_parameters():
    """Options travel as one object (a dataclass), not as long lists of positions: no function of the package takes
    more than 8 parameters, but the commands' own (Typer declares each option as one) and the model's `forward` and
    `generate`, which mirror transformers'."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef) or node.name in ("forward", "generate"):
                continue
            if any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
                   for d in node.decorator_list):
                continue
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            count = len(arguments) - (1 if arguments and arguments[0].arg in ("self", "cls") else 0)
            if count > 8:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} takes {count}")
    assert long == []


def options_classes() -> list[tuple[str, ast.ClassDef, ast.expr]]:
    """Every dataclass of the package whose name ends in `Options`: its module, its class and its `dataclass`
    decorator (`@dataclass`, `@dataclass(...)`, `@dataclasses.dataclass(...)`)."""
    found = []
    for module, path in sorted(modules().items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or not node.name.endswith("Options"):
                continue
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                if (called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)) == "dataclass":
                    found.append((module, node, decorator))
    return found


def test_options_are_built_by_name():
    """A command's options object is built from its dataclass by name, never by position: every `*Options`
    dataclass is declared `@dataclass(kw_only=True)`, so Python itself refuses `PatchOptions("#40", "#13", None,
    kinds)`, and a field added, removed or moved can never shift what a call passes into another field."""
    found = options_classes()
    assert {"PatchOptions", "AttributeOptions", "SaliencyOptions", "CircuitOptions", "RunOptions", "DatasetOptions",
            "EncodeOptions", "FeaturesOptions", "TrainOptions", "HeadsOptions", "SweepOptions"} <= {
        node.name for _, node, _ in found}  # the check sees the classes it is about
    positional = [f"{module}.{node.name}" for module, node, decorator in found
                  if not (isinstance(decorator, ast.Call) and any(
                      k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                      for k in decorator.keywords))]
    assert positional == [], "declare these @dataclass(kw_only=True)"
    # and so each one's constructor takes its fields by name only: a positional construction fails
    for module, node, _ in found:
        options = getattr(importlib.import_module(module), node.name)
        kinds = {parameter.kind for parameter in inspect.signature(options).parameters.values()}
        assert kinds <= {inspect.Parameter.KEYWORD_ONLY}, f"{module}.{node.name}"
    from tfcli.commands.patch.core import PatchOptions

    with pytest.raises(TypeError, match="positional argument"):
        PatchOptions("#40", "#13")


def test_every_package_is_installed():
    """pyproject.toml lists the packages a wheel holds (tfcli.configs is mapped from configs/): every folder of the
    package with an `__init__.py`, a new command's package among them, or an install from PyPI would lack it while
    the editable install the tests run on still finds it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join(("tfcli", *path.parent.relative_to(PACKAGE).parts)) for path in PACKAGE.rglob("__init__.py")}
    assert listed == found | {"tfcli.configs"}
