"""Bulk reassembly of a dataset directory under a memory budget (the CLI's runner).

``run(DATASET, OUT, options)`` picks the path (in memory, streaming windows, spill buckets),
writes ``OUT/rows/`` (Parquet part files) and ``OUT/report.parquet`` atomically and returns a ``Summary``.
"""


from importlib import import_module

__all__ = ["DEFAULT_BUDGET", "Route", "Summary", "WORK_DIR", "choose_route", "run"]
# imported on first use: a process that needs only the summary (a Ray driver) loads no engine
_HOMES = {"DEFAULT_BUDGET": "plan", "Route": "job", "Summary": "summary", "WORK_DIR": "job",
          "choose_route": "job", "run": "job"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f"chainrows.runners.bulk.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
