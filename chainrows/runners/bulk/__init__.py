"""Bulk reassembly of a dataset directory under a memory budget (the CLI's runner).

``run(DATASET, OUT, options)`` picks the path (in memory, streaming windows, spill buckets),
writes ``OUT/rows/`` (Parquet part files) and ``OUT/report.parquet`` atomically and returns a ``Summary``.
"""

from chainrows.runners.bulk.job import WORK_DIR, Route, choose_route, run
from chainrows.runners.bulk.plan import DEFAULT_BUDGET
from chainrows.runners.bulk.summary import Summary

__all__ = ["DEFAULT_BUDGET", "Route", "Summary", "WORK_DIR", "choose_route", "run"]
