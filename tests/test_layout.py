"""The package layout of docs/architecture.md, read from the source with ``ast``: imports flow one
way (a layer imports only itself and the layers below it), no module takes another module's
private names, no import cycles, no dead modules, and the deprecation shims stay shims."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import chainrows

PKG = Path(chainrows.__file__).parent

# Top to bottom: a module may import its own layer and the layers below it, never above.
LAYERS = [
    ("cli",),
    ("runners",),
    ("api", "synth", "testing", "explanation", "inspection"),
    ("lowering",),
    ("formats",),
    ("engine", "reference"),
    ("errors", "options", "reasons", "progress", "memory", "outdir", "arrays", "batches"),
]
# Deprecated import paths (docs/architecture.md "Shims"): above every layer; nothing imports them.
SHIMS = ("io", "bulk", "ray")
# Entry points nothing in the package imports: the package itself, ``python -m`` targets, the
# oracle and the testing helpers (imported by tests), the shims, and what the root package
# loads lazily by name (``chainrows.batches``).
ENTRY_POINTS = {"chainrows", "chainrows.__main__", "chainrows.cli.__main__", "chainrows.synth.__main__",
                "chainrows.reference", "chainrows.reference.calls", "chainrows.testing", "chainrows.testing.reconcile",
                "chainrows.batches"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _top(name: str) -> str:
    """The top-level part of chainrows a module belongs to: ``chainrows.formats.native.x`` -> formats."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _rank(name: str) -> int:
    top = _top(name)
    if top in SHIMS or top in ("", "__main__"):
        return -1
    for rank, tops in enumerate(LAYERS):
        if top in tops:
            return rank
    raise AssertionError(f"{name}: its top-level part {top!r} is in no layer of LAYERS")


class _Import:
    def __init__(self, target: str, names: list[str], line: int, module_level: bool):
        self.target, self.names, self.line, self.module_level = target, names, line, module_level


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str) -> list[_Import]:
    """Every chainrows import of module ``name`` (lazy ones in functions included), each to the
    module it loads: ``from chainrows.x import y`` names module ``chainrows.x.y`` when that is a
    module, else ``chainrows.x``. Imports under ``if TYPE_CHECKING`` never run: skipped."""
    tree = ast.parse(MODULES[name].read_text())
    found: list[_Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    visit(sub, module_level)
                continue
            if isinstance(child, ast.ImportFrom):
                target = _resolve(name, child)
                if target.split(".")[0] == "chainrows":
                    plain = []
                    for alias in child.names:
                        sub = f"{target}.{alias.name}"
                        if sub in MODULES:
                            found.append(_Import(sub, [], child.lineno, module_level))
                        else:
                            plain.append(alias.name)
                    if plain:
                        found.append(_Import(target, plain, child.lineno, module_level))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "chainrows":
                        found.append(_Import(alias.name, [], child.lineno, module_level))
            inner = module_level and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner)

    visit(tree, True)
    return found


IMPORTS = {name: _imports(name) for name in MODULES}


def test_every_import_names_a_module_of_the_package():
    missing = [f"{name}:{imp.line} imports {imp.target}" for name, imps in IMPORTS.items()
               for imp in imps if imp.target not in MODULES]
    assert not missing, "\n".join(missing)


def test_imports_flow_one_way_down_the_layers():
    """cli -> runners -> api (synth, testing beside it) -> lowering -> formats -> engine and
    reference -> the base; a module imports its own layer or one below."""
    wrong = []
    for name, imps in IMPORTS.items():
        if _rank(name) < 0:
            continue
        for imp in imps:
            if imp.target == "chainrows" and set(imp.names) <= {"__version__"}:
                continue  # the root package holds the version and imports nothing when loaded
            if imp.target in MODULES and _rank(imp.target) < _rank(name):
                wrong.append(f"{name}:{imp.line} imports {imp.target} (a layer above it)")
    assert not wrong, "\n".join(wrong)


def test_engine_and_reference_stay_independent_and_production_code_never_imports_the_oracle():
    """The kernels and the oracle are held to each other: they share no code. Only tests
    import the oracle."""
    wrong = [f"{name}:{imp.line} imports {imp.target}" for name, imps in IMPORTS.items()
             for imp in imps
             if (_top(imp.target) == "reference" and _top(name) != "reference")
             or (_top(imp.target) == "engine" and _top(name) == "reference")]
    assert not wrong, "\n".join(wrong)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(name: str) -> str:
    return name if _is_package(name) else name.rsplit(".", 1)[0]


def test_no_module_takes_another_modules_private_names():
    """No ``from x import _y``, no ``x._y`` on an imported module, no import of another
    package's private module (``pkg/_mod.py``). Where a module needs another's helper, the
    helper is public, with a docstring stating its contract."""
    wrong = []
    for name, imps in IMPORTS.items():
        for imp in imps:
            if imp.target == name:
                continue
            wrong += [f"{name}:{imp.line} imports {imp.target}.{n}" for n in imp.names if _private(n)]
            parts = imp.target.split(".")
            if any(_private(p) for p in parts) and not name.startswith(_package_of(imp.target)):
                wrong.append(f"{name}:{imp.line} imports the private module {imp.target}")
        tree = ast.parse(MODULES[name].read_text())
        module_aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(name, node)
                for alias in node.names:
                    if f"{target}.{alias.name}" in MODULES:
                        module_aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in MODULES:
                        module_aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in module_aliases and _private(node.attr)
                    and module_aliases[node.value.id] != name):
                wrong.append(f"{name}:{node.lineno} uses {module_aliases[node.value.id]}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    """Among the imports that run when a module is imported (module level): no cycle."""
    graph = {name: sorted({imp.target for imp in imps if imp.module_level and imp.target != name
                           and imp.target in MODULES})
             for name, imps in IMPORTS.items()}
    state: dict[str, int] = {}
    cycles = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            walk(name, [name])
    assert not cycles, "\n".join(cycles)


def test_no_dead_modules():
    """Every module is imported by another module of the package, or is an entry point."""
    imported = {imp.target for imps in IMPORTS.values() for imp in imps}
    imported |= {t.rsplit(".", 1)[0] for t in imported}  # loading a module loads its package
    dead = sorted(name for name in MODULES if name not in imported and name not in ENTRY_POINTS
                  and _top(name) not in SHIMS)
    assert not dead, dead


def test_shims_only_forward():
    """A shim imports its new home (and chainrows.io's helper) and nothing else; no module of
    the layers imports a shim."""
    wrong = [f"{name}:{imp.line} imports the shim {imp.target}" for name, imps in IMPORTS.items()
             if _rank(name) >= 0 for imp in imps if _top(imp.target) in SHIMS]
    assert not wrong, "\n".join(wrong)


SHIM_NAMES = {
    "chainrows.io.jsonl": ("import_jsonl", "chainrows.formats.jsonl.importer"),
    "chainrows.io.schema": ("LEDGER_SCHEMA", "chainrows.formats.native.schema"),
    "chainrows.io.dataset": ("read_dataset", "chainrows.formats.native.dataset"),
    "chainrows.io.fingerprint": ("fingerprint", "chainrows.formats.items"),
    "chainrows.io.gym": ("import_gym", "chainrows.formats.gym.importer"),
    "chainrows.bulk": ("run", "chainrows.runners.bulk.job"),
    "chainrows.ray": ("reassemble", "chainrows.runners.ray"),
}


@pytest.mark.parametrize("old", sorted(SHIM_NAMES))
def test_a_shim_warns_and_gives_the_same_object(old):
    name, new = SHIM_NAMES[old]
    import sys

    for key in [k for k in sys.modules if k == old]:
        del sys.modules[key]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and old in str(w.message) for w in caught)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
