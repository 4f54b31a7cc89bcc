"""The layering of docs/architecture.md, checked on the code as it is.

cli -> render -> entry points (live, watching, collect, …) -> analysis -> sources -> model ->
errors/units: imports point downward only; only cli/ and render/ may import click or rich;
no import cycle, even through imports inside functions. (A function's size is ruff's to
bound: C901, PLR0912, PLR0915 in pyproject.toml; modules have no line cap.) A failure names
the file and the import that broke the rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "memforensics"
# Higher may import lower, never the other way round.
RANK = {
    "cli": 6,
    "render": 5,
    "entry": 4,
    "analysis": 3,
    "sources": 2,
    "model": 1,
    "errors": 0,
    "units": 0,
}
# `python -m memforensics` runs the CLI: the one module allowed to point up.
ALLOWED_UPWARD = {("memforensics.__main__", "memforensics.cli")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "memforensics":
        return None
    if len(parts) == 1:
        return "entry"
    return parts[1] if parts[1] in RANK else "entry"


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found.append((dotted.removesuffix(".__init__"), path))
    return found


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


MODULES = _modules()


def test_the_package_has_the_layers_the_doc_describes() -> None:
    layers = {_layer(name) for name, _ in MODULES}
    assert {"cli", "render", "analysis", "sources", "model", "entry"} <= layers


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[name for name, _ in MODULES])
def test_imports_point_downward_only(module: str, path: Path) -> None:
    mine = _layer(module)
    assert mine is not None
    upward = [
        name
        for name in _imports(path)
        if (other := _layer(name)) is not None
        and RANK[other] > RANK[mine]
        and (module, name) not in ALLOWED_UPWARD
    ]
    assert upward == [], f"{module} ({mine}) imports a higher layer: {upward}"


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[name for name, _ in MODULES])
def test_only_cli_and_render_import_click_or_rich(module: str, path: Path) -> None:
    if _layer(module) in ("cli", "render"):
        return
    ui = [name for name in _imports(path) if name.split(".")[0] in ("click", "rich")]
    assert ui == [], f"library module {module} imports {ui}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule above is not vacuous: a model module importing the CLI is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from memforensics.cli import main\nimport rich\n")
    assert "memforensics.cli" in _imports(bad)
    assert RANK[_layer("memforensics.cli") or ""] > RANK[_layer("memforensics.model.heap") or ""]


DOC = PACKAGE.parent / "docs" / "architecture.md"


def test_every_sources_folder_and_module_is_on_the_map() -> None:
    """docs/architecture.md names each domain folder of sources/ and each module in it, so a
    folder or module added without a sentence on the map fails here."""
    doc = DOC.read_text(encoding="utf-8")
    folders = sorted(p for p in (PACKAGE / "sources").iterdir() if (p / "__init__.py").exists())
    assert folders, "sources/ has no domain folders"
    for folder in folders:
        assert f"`sources/{folder.name}/`" in doc, f"sources/{folder.name}/ is not on the map"
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py":
                assert f"`{module.name}`" in doc, f"{module} is not on the map"
    loose = [p.name for p in (PACKAGE / "sources").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"modules outside a domain folder of sources/: {loose}"


def test_every_entry_point_is_in_the_entry_package() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "errors", "units"], top
    doc = DOC.read_text(encoding="utf-8")
    for module in sorted((PACKAGE / "entry").rglob("*.py")):
        if module.name != "__init__.py":
            named = module.relative_to(PACKAGE / "entry").as_posix()
            assert f"`{named}`" in doc, f"{module} is not on the map"


def _module_graph() -> dict[str, set[str]]:
    """Every import between the package's modules, at module level or inside a function
    (``from a import b`` counts as importing ``a.b`` where that is a module)."""
    known = {name for name, _ in MODULES}
    graph: dict[str, set[str]] = {}
    for module, path in MODULES:
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                names.append(node.module)
            for name in names:
                if name in known and name != module:
                    edges.add(name)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_anywhere_in_the_package() -> None:
    """Function-level imports count: a cycle hidden inside functions still ties the modules
    together (a change to one needs the other)."""
    graph = _module_graph()
    # a package's __init__ importing its own modules is not a cycle of design
    for module in graph:
        graph[module] = {o for o in graph[module] if not module.startswith(o + ".")}
    assert _cycles(graph) == []


def test_the_cycle_checker_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[name for name, _ in MODULES])
def test_render_never_imports_entry(module: str, path: Path) -> None:
    """Renderers take model records: what a command shows does not depend on how it ran."""
    if _layer(module) != "render":
        return
    assert [n for n in _imports(path) if n.startswith("memforensics.entry")] == []


def _own_flags() -> set[str]:
    from memforensics.cli import COMMAND_MODULES, cli

    flags: set[str] = set()
    for name in COMMAND_MODULES:
        command = cli.get_command(None, name)  # type: ignore[arg-type]
        for param in getattr(command, "params", ()):
            flags.update(opt for opt in getattr(param, "opts", ()) if opt.startswith("--"))
    return flags


def test_no_hint_outside_cli_names_a_flag() -> None:
    """Only cli/failures.py adds a flag to a hint, and only a flag the running command has:
    a library hint naming `--gdb` is wrong for every command without it. Another tool's
    command line quoted in backticks is not ours."""
    flags = _own_flags()
    assert {"--gdb", "--read-only", "--timeout"} <= flags
    offenders = []
    for module, path in MODULES:
        if _layer(module) == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_hint = isinstance(node, ast.keyword) and node.arg == "hint"
            is_default = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "default_hint" for t in node.targets
            )
            value = getattr(node, "value", None)
            if not (is_hint or is_default) or value is None:
                continue
            for piece in ast.walk(value):
                if isinstance(piece, ast.Constant) and isinstance(piece.value, str):
                    # a `quoted` command line is another tool's (journalctl --file FILE)
                    text = re.sub(r"`[^`]*`", "", piece.value)
                    named = [f for f in flags if re.search(rf"{re.escape(f)}\b", text)]
                    if named:
                        offenders.append(f"{module}: {named} in {text!r}")
    assert offenders == []
