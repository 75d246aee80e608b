"""Output buffers for the row columns, taken from Arrow's memory pool instead of numpy's.

The row columns end up in Arrow tables anyway (zero copy either way). The difference is what
happens to a buffer after it is freed: Arrow's default pool (mimalloc or jemalloc) keeps
recently freed pages mapped for a while, so the next batch reuses them, where numpy's large
allocations are fresh mappings whose every page faults in (and is zeroed by the kernel) on
first write (docs/decisions-engine.md has the measurement).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def empty(n: int, dtype) -> np.ndarray:
    """An uninitialised, writable 1-D array of ``n`` items backed by an Arrow buffer."""
    dtype = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(max(int(n), 0) * dtype.itemsize), dtype=dtype)
