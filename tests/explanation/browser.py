"""Headless Chromium for the inspect tests: the rendered DOM and a screenshot of a local file.

Debian's ``chromium`` (``.ci/run`` installs it when missing). It runs in a network namespace
with only ``lo`` when ``unshare`` allows (the page needs no network at all: a request would fail
there), with the flags that keep it from calling home."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise AssertionError("headless Chromium is not installed (apt-get install chromium; .ci/run does it)")
    return found


def _isolated(cmd: list[str]) -> list[str]:
    if shutil.which("unshare") and subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0:
        return ["unshare", "--net", *cmd]
    return cmd


def run(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = _isolated([chromium(), *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def rendered_dom(page: Path, profile: Path) -> str:
    done = run(page, profile, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def screenshot(page: Path, profile: Path, png: Path, size: str = "1280,2400") -> Path:
    done = run(page, profile, f"--screenshot={png}", f"--window-size={size}")
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return png
