"""The exploratory notebooks (notebooks/*.ipynb) run top to bottom on a small synthetic dataset.

Each notebook is executed with nbclient in a fresh ``python3`` kernel, from a temp directory, with
CHAINROWS_NB_ROLLOUTS=200 and no CHAINROWS_DATASET (so it generates its own data). The kernel
gets the repo root on PYTHONPATH, so this works with or without ``pip install -e``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # tests/README.md: notebooks

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")
pytest.importorskip("ipykernel")


NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT = 300  # seconds per cell; each notebook takes ~10 s at this size


def _kernel_available() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return False
    return True


@pytest.fixture()
def nb_env(monkeypatch, tmp_path):
    """The kernel inherits this process's environment: small size, headless matplotlib, no
    user dataset, chainrows importable from the repo."""
    if not _kernel_available():
        pytest.skip("no python3 Jupyter kernel (pip install ipykernel)")
    monkeypatch.setenv("CHAINROWS_NB_ROLLOUTS", "200")
    monkeypatch.delenv("CHAINROWS_DATASET", raising=False)
    monkeypatch.delenv("CHAINROWS_NB_ROLLOUT", raising=False)
    # Headless: the inline backend renders every figure to PNG (so drawing errors surface and
    # the figures can be counted), unlike Agg, which would never draw them.
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' synthetic data lands here
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    return workdir


def _execute(name: str, workdir: Path):
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), f"{name} is stored with outputs"
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    text, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{name}: {out.get('ename')}: {out.get('evalue')}"
            if out.output_type == "stream":
                text.append(out.text)
            elif "data" in out:
                images += "image/png" in out.data
                text.append(out.data.get("text/plain", ""))
    return "".join(text), images


def test_tour_notebook(nb_env):
    text, images = _execute("01_tour.ipynb", nb_env)
    assert "wx_s0" in text and "wx_s1" in text  # the worked example's two cc rows
    assert "[1, 2, 3, 10, 11, 4, 12, 13]" in text
    assert "multiple_roots" in text  # ordinary mode masks it
    assert "engine and reference agree on every column of rows and report" in text
    assert images >= 2  # the worked example picture, the forest rollout picture
    assert "broken_chain under the linear plan, ok under the forest plan" in text
    assert "every selected generation is trained in exactly one row" in text
    assert not any(nb_env.iterdir()), "the notebook wrote into its working directory"


def test_dataset_health_notebook(nb_env):
    text, images = _execute("02_dataset_health.ipynb", nb_env)
    assert "cc / ordinary" in text  # the cc vs ordinary table
    assert "forest / cc" in text and "forest / ordinary" in text  # ... and the forest plan's columns
    assert "recovered by the forest plan" in text
    assert "rollouts kept" in text and "loss tokens" in text
    assert "has tokens" in text  # the drill-down's ledger table
    assert images >= 4  # distributions, reasons, cc vs ordinary, advantages
    assert not any(nb_env.iterdir()), "the notebook wrote into its working directory"


def test_render_writes_markdown_with_figures(nb_env, tmp_path):
    """`python notebooks/render.py NAME --out DIR`: the page and its PNG figures in DIR, no path
    of this machine in the page, and the stored notebook left without outputs."""
    import subprocess
    import sys

    source = (NOTEBOOKS / "01_tour.ipynb").read_bytes()
    out = tmp_path / "rendered"
    res = subprocess.run([sys.executable, str(NOTEBOOKS / "render.py"), "01_tour.ipynb", "--out", str(out),
                          "--rollouts", "200"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    page = (out / "01_tour.md").read_text()
    figures = sorted((out / "01_tour_files").glob("*.png"))
    assert len(figures) >= 2 and all(f.read_bytes().startswith(b"\x89PNG") for f in figures)
    for f in figures:
        assert f"](01_tour_files/{f.name})" in page
    assert "```python" in page and "wx_s0" in page  # code and its output
    assert str(REPO) not in page and str(tmp_path) not in page and "IPKernelApp" not in page
    assert (NOTEBOOKS / "01_tour.ipynb").read_bytes() == source


def test_render_refuses_an_unknown_notebook(tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(NOTEBOOKS / "render.py"), "nope.ipynb", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "nope.ipynb" in res.stderr and not any(tmp_path.iterdir())
