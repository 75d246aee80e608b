"""chainrows.engine.jit: the kernels' compiler pipeline (copy propagation, nothing else removed)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from chainrows.engine.jit import OPTIONS, jit

PLAIN = {k: v for k, v in OPTIONS.items() if k != "pipeline_class"}


def _probe_args():
    """Tiny arguments for strjoin.probe_groups: one group holding "a", one probe of "a"."""
    from chainrows.engine.batch import readonly
    from chainrows.engine.strjoin import index_groups, new_tables, table_offsets

    build_off = np.array([0, 1], dtype=np.int64)
    pos = np.array([0], dtype=np.int64)
    soff, data = np.array([0, 1], dtype=np.int64), np.frombuffer(b"a", dtype=np.uint8).copy()
    tab_off = table_offsets(build_off)
    slot, slot_hash = new_tables(tab_off)
    no_nulls = readonly(np.zeros(0, dtype=bool))
    index_groups(np.array([0, 1], dtype=np.int64), readonly(build_off), readonly(pos), readonly(soff),
                 readonly(data), no_nulls, readonly(tab_off), slot, slot_hash, np.empty(1, dtype=np.int64))
    found = np.full(1, -7, dtype=np.int64)
    args = (np.array([0, 1], dtype=np.int64), readonly(build_off), readonly(pos), readonly(soff),
            readonly(data), readonly(tab_off), readonly(slot), readonly(slot_hash),
            readonly(np.zeros(1, dtype=np.int64)), readonly(pos), readonly(soff), readonly(data), no_nulls,
            -2, -1, found)
    return args, found


@pytest.mark.slow
def test_kernel_pipeline_drops_the_reference_counts_of_inlined_helpers():
    """Without the copy-propagation pass every array passed to an inlined helper costs an atomic
    incref/decref per call (docs/decisions-engine.md "Threads"); with it, none are left."""
    from chainrows.engine.strjoin import probe_groups

    counts = {}
    for name, options in (("plain", PLAIN), ("chainrows", OPTIONS)):
        kernel = numba.njit(**{**options, "cache": False})(probe_groups.py_func)
        args, found = _probe_args()
        kernel(*args)
        assert found.tolist() == [0]
        counts[name] = sum(ir.count("call void @NRT_incref") for ir in kernel.inspect_llvm().values())
    assert counts["plain"] > 0  # the pass has something to remove here
    assert counts["chainrows"] == 0


@numba.njit(**{**OPTIONS, "cache": False})
def _tail_view(a):
    return a[1:]


def _through_view(out, i):
    v = out.view(np.uint32)
    v[i] = 7


def _through_asarray(out, i):
    v = np.asarray(out)
    v[i] = 7


def _through_helper(out, i):
    v = _tail_view(out)
    v[i - 1] = 7


def test_writes_through_views_the_ir_cannot_alias_are_kept():
    """Numba's general dead-code removal drops a write into ``out.view(...)``, ``np.asarray(out)``
    or a view a helper returns (it cannot tell they alias an argument); the pipeline must not."""
    for fn in (_through_view, _through_asarray, _through_helper):
        kernel = jit(cache=False)(fn)
        out = np.zeros(4, dtype=np.uint32)
        kernel(out, 2)
        assert out.tolist() == [0, 0, 7, 0], fn.__name__
