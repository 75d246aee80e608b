"""Render the notebooks, figures included, into Markdown: ``python notebooks/render.py``.

Each ``notebooks/<name>.ipynb`` (stored without outputs, and left so) is executed top to bottom
with nbclient in a fresh ``python3`` kernel, from an empty temp directory, on the synthetic data
it generates itself (no ``CHAINROWS_DATASET``). The result is written as ``<out>/<name>.md``
with its figures as ``<out>/<name>_files/<name>_<cell>_<k>.png`` (default ``docs/notebooks``).
Markdown cells are copied, code cells become ``python`` blocks, text outputs plain blocks;
the repository's and the temp directory's paths in outputs are replaced by ``<repo>`` and
``$TMPDIR``, so the pages name no path of the machine that rendered them.

Needs the ``notebooks`` extra (nbformat, nbclient, ipykernel, matplotlib); no nbconvert.
Exit codes: 0 rendered, 2 bad arguments or a notebook that fails or is stored with outputs.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
DEFAULT_OUT = REPO / "docs" / "notebooks"
CELL_TIMEOUT = 600  # seconds per cell
# the kernel's own start-up warnings (e.g. "[IPKernelApp] WARNING | Kernel is running over TCP")
KERNEL_NOISE = re.compile(r"\[IPKernelApp\][^\n]*\n?")


def render(name: str, out_dir: Path, *, rollouts: int | None = None) -> Path:
    """Execute ``notebooks/<name>`` and write ``out_dir/<stem>.md`` plus its PNG figures;
    returns the Markdown path. The figures directory is replaced whole. Raises ValueError for
    a notebook stored with outputs, nbclient's CellExecutionError for a failing cell."""
    import nbclient
    import nbformat

    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    if any(c.get("outputs") or c.get("execution_count") is not None
           for c in nb.cells if c.cell_type == "code"):
        raise ValueError(f"{path.name} is stored with outputs: clear them first")
    stem = path.stem
    with tempfile.TemporaryDirectory(prefix="chainrows-render-") as tmp:
        tmp = Path(tmp).resolve()
        (tmp / "cwd").mkdir()
        env = _kernel_env(tmp, rollouts)
        saved = {k: os.environ.get(k) for k in env}
        for k, v in env.items():  # the kernel inherits this process's environment
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                             resources={"metadata": {"path": str(tmp / "cwd")}})
            client.execute()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        scrub = [(str(tmp), "$TMPDIR"), (str(REPO), "<repo>")]
        if os.path.realpath(tempfile.gettempdir()) != str(tmp):
            scrub.append((os.path.realpath(tempfile.gettempdir()), "$TMPDIR"))
        figures = out_dir / f"{stem}_files"
        shutil.rmtree(figures, ignore_errors=True)
        text = _markdown(nb, stem, figures, scrub)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{stem}.md"
    md.write_text(text)
    return md


def _kernel_env(tmp: Path, rollouts: int | None) -> dict[str, str | None]:
    """The variables the kernel gets (None: unset)."""
    env = {
        # the inline backend renders every figure to PNG in the cell's outputs
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "TMPDIR": str(tmp),  # the notebooks' synthetic data lands here, removed afterwards
        "CHAINROWS_DATASET": None,  # None: unset, so each notebook makes its own data
        "CHAINROWS_NB_ROLLOUT": None,
    }
    if rollouts is not None:
        env["CHAINROWS_NB_ROLLOUTS"] = str(rollouts)
    return env


def _markdown(nb, stem: str, figures: Path, scrub: list[tuple[str, str]]) -> str:
    def clean(text: str) -> str:
        for old, new in scrub:
            text = text.replace(old, new)
        return KERNEL_NOISE.sub("", text).rstrip("\n")

    parts = [f"<!-- Rendered from notebooks/{stem}.ipynb by `python notebooks/render.py`; "
             "edit the notebook, not this page. -->"]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            parts.append(cell.source.rstrip("\n"))
            continue
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        parts.append(f"```python\n{cell.source.rstrip()}\n```")
        k = 0
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(_block(clean(out.text)))
            elif out.output_type == "error":  # nbclient raises first; kept for allow_errors
                parts.append(_block(clean(f"{out.ename}: {out.evalue}")))
            elif "image/png" in out.get("data", {}):
                figures.mkdir(parents=True, exist_ok=True)
                png = figures / f"{stem}_{i:02d}_{k}.png"
                png.write_bytes(base64.b64decode(out.data["image/png"]))
                parts.append(f"![figure {k + 1} of cell {i}]({figures.name}/{png.name})")
                k += 1
            elif "text/markdown" in out.get("data", {}):
                parts.append(clean(out.data["text/markdown"]))
            elif "text/plain" in out.get("data", {}):
                parts.append(_block(clean(out.data["text/plain"])))
    return "\n\n".join(p for p in parts if p) + "\n"


def _block(text: str) -> str:
    return f"```text\n{text}\n```" if text.strip() else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python notebooks/render.py",
                                 description="Execute the notebooks and write them, figures included, as Markdown.")
    ap.add_argument("names", nargs="*", help="notebooks to render, e.g. 01_tour.ipynb (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: docs/notebooks)")
    ap.add_argument("--rollouts", type=int, default=None,
                    help="synthetic rollouts per notebook (default: each notebook's own)")
    a = ap.parse_args(argv)
    names = a.names or sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    missing = [n for n in names if not (NOTEBOOKS / n).is_file()]
    if missing:
        ap.error(f"no such notebook in notebooks/: {', '.join(missing)}")
    for name in names:
        try:
            md = render(name, a.out, rollouts=a.rollouts)
        except Exception as exc:  # a failing cell or a notebook stored with outputs
            print(f"render: {name}: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}", file=sys.stderr)
            return 2
        print(f"{name} -> {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
