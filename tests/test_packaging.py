"""Packaging: LICENSE, CHANGELOG, py.typed shipped by the setuptools config, .gitignore entries."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

import chainrows

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_the_full_apache_2_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX" in text
    for section in range(1, 10):
        assert f"\n   {section}. " in text or f"\n    {section}. " in text, section
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["license"] == {"text": "Apache-2.0"}


def test_the_chainrows_script_is_console_main():
    """The script keeps pandas out of its process as ``python -m chainrows`` does (cli.console_main)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["scripts"] == {"chainrows": "chainrows.cli:console_main"}


def test_changelog_names_the_current_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog") and f"## {chainrows.__version__}" in text


def test_gitignore_covers_demo_outputs_and_tool_dirs():
    entries = set((ROOT / ".gitignore").read_text(encoding="utf-8").split())
    assert {"demo-data/", "demo-out/", ".venv/", ".asv/"} <= entries


def test_build_ships_py_typed_and_main(tmp_path):
    """setuptools' build_py (what a wheel holds) copies py.typed and __main__.py."""
    assert (ROOT / "chainrows" / "py.typed").is_file()
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "chainrows", src / "chainrows",
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    lib = tmp_path / "lib"
    out = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()",
                          "build_py", "--build-lib", str(lib)], cwd=src, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (lib / "chainrows" / "py.typed").is_file()
    assert (lib / "chainrows" / "__main__.py").is_file()
    assert (lib / "chainrows" / "batches" / "packed.py").is_file()
