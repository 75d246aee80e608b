"""Deprecated import paths, kept so that code importing a documented name from its old home still
runs: each module here warns ``DeprecationWarning`` once (when first imported) and re-exports its
new home's names. Nothing in the package imports them (tests/test_layout.py).

========================== ==============================================================
old import path            new home
========================== ==============================================================
chainrows.io.jsonl         chainrows.formats.jsonl (importer, and the line parser: lines)
chainrows.io.schema        chainrows.formats.native.schema
chainrows.io.dataset       chainrows.formats.native.dataset (``check_*`` -> ``validate_*``)
chainrows.io.fingerprint   chainrows.formats.items
chainrows.io.gym           chainrows.formats.gym
chainrows.bulk             chainrows.runners.bulk
chainrows.ray              chainrows.runners.ray
========================== ==============================================================
"""

from __future__ import annotations

import importlib
import warnings


def moved(namespace: dict, *homes: str, renamed: dict[str, str] | None = None) -> None:
    """Make the module whose globals are ``namespace`` a deprecation shim of the modules
    ``homes``: warn DeprecationWarning (once: a module body runs once), copy their public names
    into it, and resolve any other name (a lazily loaded one, or an old name in ``renamed``,
    old -> new) on the homes when it is first asked for."""
    old = namespace["__name__"]
    warnings.warn(f"{old} is deprecated; import from {' or '.join(homes)} instead",
                  DeprecationWarning, stacklevel=3)
    modules = [importlib.import_module(home) for home in homes]
    for module in reversed(modules):  # the first home wins a name two of them hold
        namespace.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    renames = dict(renamed or {})

    def __getattr__(name: str):
        wanted = renames.get(name, name)
        for module in modules:
            if wanted in vars(module) or wanted in getattr(module, "__all__", ()):
                return getattr(module, wanted)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    namespace["__getattr__"] = __getattr__
