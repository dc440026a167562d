"""The package's modules import each other without cycles (imports inside functions and the
modules the command line loads by name count; imports under ``if TYPE_CHECKING:`` do not),
and the command-line parsers live in one place: ``nlmfeature.commands``."""
from __future__ import annotations

import ast
import os
from typing import Dict, Set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")


def _modules() -> Dict[str, str]:
    mods = {}
    for d, _, files in os.walk(os.path.join(SRC, "nlmfeature")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
                mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    for pyx in os.listdir(os.path.join(ROOT, "cython", "nlmfeature")):     # compiled: no imports
        if pyx.endswith(".pyx"):
            mods["nlmfeature." + pyx[:-4]] = ""
    return mods


def _absolute(mods: Dict[str, str], module: str, name: str, level: int) -> str:
    if not level:
        return name
    package = module if mods[module].endswith("__init__.py") else module.rsplit(".", 1)[0]
    parts = package.split(".")
    return ".".join(parts[:len(parts) - level + 1] + ([name] if name else []))


def _known(mods: Dict[str, str], name: str) -> str:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> Dict[str, Set[str]]:
    """module -> the package modules it imports (anywhere in it, outside TYPE_CHECKING)."""
    mods = _modules()
    graph: Dict[str, Set[str]] = {}
    for module, path in mods.items():
        deps: Set[str] = set()
        if not path:
            graph[module] = deps
            continue

        def visit(node: ast.AST) -> None:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                for n in node.orelse:
                    visit(n)
                return
            if isinstance(node, ast.Import):
                deps.update(_known(mods, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mods, module, node.module or "", node.level)
                deps.update(_known(mods, f"{base}.{a.name}") or _known(mods, base) for a in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(".") and node.value.lstrip(".")[:1].isalpha():
                # a module named for importlib (COMMAND_MODULES)
                level = len(node.value) - len(node.value.lstrip("."))
                target = _absolute(mods, module, node.value.lstrip("."), level)
                if target in mods:
                    deps.add(target)
            for child in ast.iter_child_nodes(node):
                visit(child)

        visit(ast.parse(open(path, encoding="utf-8").read(), path))
        graph[module] = {d for d in deps if d and d != module and d in mods}
    return graph


def _cycle(graph: Dict[str, Set[str]]):
    """One import cycle as a list of modules, or None."""
    state: Dict[str, int] = {}
    stack = []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = dfs(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = dfs(m)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_graph_sees_function_level_and_named_imports():
    graph = import_graph()
    assert "nlmfeature.commands.train" in graph["nlmfeature.cli"]          # by name, for importlib
    assert "nlmfeature.commands.base" in graph["nlmfeature.cli"]
    assert "nlmfeature.core.model" in graph["nlmfeature"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_parser_is_built_in_the_commands_package():
    """argparse parsers are made only by nlmfeature.cli (the top level) and the modules of
    nlmfeature.commands; the modules doing the work take parsed arguments."""
    outside = []
    for module, path in _modules().items():
        if not path or module == "nlmfeature.cli" or module.startswith("nlmfeature.commands"):
            continue
        text = open(path, encoding="utf-8").read()
        if "add_parser(" in text or "ArgumentParser(" in text or "add_subparsers(" in text:
            outside.append(module)
    assert outside == []
