"""Reading the docs' prose for the tests that hold it to the code: paragraphs and dotted names."""

from __future__ import annotations

import importlib
import re
import warnings


def paragraphs(text: str) -> list[str]:
    """The page as bullets, table rows and paragraphs: a bare file name is read against the
    folders cited in the same group."""
    groups, current = [], []
    for line in text.splitlines():
        if not line.strip() or line.startswith(("- ", "|", "#", "```")) or re.match(r"\d+\. ", line):
            if current:
                groups.append("\n".join(current))
            current = [line] if line.strip() else []
        else:
            current.append(line)
    if current:
        groups.append("\n".join(current))
    return groups


def resolve_dotted(name: str):
    """``chainrows.a.b.c``: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the shims' old paths
                obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)
