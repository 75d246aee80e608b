"""What the process holds: its resident set, and handing freed memory back to the OS."""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

import pyarrow as pa


def _find_malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError, TypeError):
        return None


_MALLOC_TRIM = _find_malloc_trim()


def release_memory() -> None:
    """Hand freed memory back to the OS: Arrow's pool, then glibc's heap. NumPy arrays live in
    the latter, and one freed below glibc's adaptive mmap threshold (up to 32 MiB) stays
    resident until trimmed (docs/limits.md)."""
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_rss() -> int | None:
    """This process's resident set now (VmRSS), or None where /proc is unavailable."""
    return _status_bytes("VmRSS")


def process_peak_rss() -> int | None:
    """This process's peak resident set so far (VmHWM), or None where /proc is unavailable."""
    return _status_bytes("VmHWM")


@contextmanager
def one_arrow_thread():
    """Arrow's CPU thread pool at one thread, restored afterwards. Arrow's allocator keeps
    memory freed by a thread in that thread's heap, so what a run retains grows with the
    threads decoding for it; a tight budget runs with one (docs/limits.md)."""
    previous = pa.cpu_count()
    pa.set_cpu_count(1)
    try:
        yield
    finally:
        pa.set_cpu_count(previous)
