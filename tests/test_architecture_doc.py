"""docs/architecture.md cannot drift: every dotted name it cites (``chainrows.x.y``) imports or
is an attribute, every path (``chainrows/x/y.py``, a folder, a bare ``y.py`` of a package it
names, a link) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.docs import paragraphs, resolve_dotted

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
# Cited before they exist: reserved for work in progress (the page says so).
RESERVED: set = set()


def _cited(group: str) -> list[str]:
    return [t for t in re.findall(r"`([^`\n]+)`", group) if " " not in t]


def _problems() -> list[str]:
    text = PAGE.read_text()
    problems = []
    for group in paragraphs(text):
        folders = [REPO / t for t in _cited(group) if t.startswith("chainrows/") and t.endswith("/")]
        for token in _cited(group):
            if token in RESERVED:
                continue
            if re.fullmatch(r"chainrows(\.\w+)+", token):
                try:
                    resolve_dotted(token)
                except (ImportError, AttributeError) as exc:
                    problems.append(f"{token}: {exc}")
            elif "/" in token and re.fullmatch(r"[\w./-]+", token):
                if not (REPO / token).exists():
                    problems.append(f"{token}: no such path")
            elif re.fullmatch(r"[\w]+\.(py|md)", token):
                if not any((f / token).exists() for f in folders) and not list((REPO / "chainrows").rglob(token)):
                    problems.append(f"{token}: in none of {[str(f.relative_to(REPO)) for f in folders]}")
        for link in re.findall(r"\]\(([^)#]+)", group):
            if "://" not in link and not (PAGE.parent / link).exists():
                problems.append(f"link {link}: no such file")
    return problems


def test_every_path_and_dotted_name_on_the_architecture_page_exists():
    problems = _problems()
    assert not problems, "\n".join(problems)


def test_every_package_of_the_layout_is_on_the_page():
    """A new top-level package or module gets its line on the page."""
    text = PAGE.read_text()
    tops = sorted(p.name for p in (REPO / "chainrows").iterdir()
                  if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__"))
    missing = [t for t in tops if f"chainrows/{t}" not in text and f"chainrows.{Path(t).stem}" not in text]
    assert not missing, missing


@pytest.mark.parametrize("bad", ["chainrows.no_such_module", "chainrows.api.no_such_name"])
def test_the_resolver_fails_on_a_stale_name(bad):
    with pytest.raises((ImportError, AttributeError)):
        resolve_dotted(bad)
