"""Benchmarks for chainrows: an airspeed-velocity (asv) suite plus a side-by-side ratio report.

- ``asv_benchmarks/stages.py``: one asv class per engine stage (join, decide, gather,
  advantages, Parquet -> Parquet, xxh3) and ``track_`` benchmarks of compile/start-up time.
- ``python -m asv_benchmarks.side_by_side``: engine vs reference, vs a memcpy floor, vs a
  pyarrow floor, peak RSS and compile time, printed as one table of ratios.

See ``asv_benchmarks/README.md`` for the commands.

asv runs benchmarks with PYTHONPATH removed (set ``ASV_PYTHONPATH`` to pass one). When
``chainrows`` is not importable at all (not installed, no ASV_PYTHONPATH), fall back to the
checkout this directory lives in, so ``asv run --python=same`` works from a bare checkout.
"""

import importlib.util
import os
import sys

if importlib.util.find_spec("chainrows") is None:  # pragma: no cover - depends on the environment
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
