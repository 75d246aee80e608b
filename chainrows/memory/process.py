"""What the process holds: its resident set, handing freed memory back to the OS, whether its
new memory may come as transparent huge pages, and whether pandas may load."""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager

import pyarrow as pa


def _libc(name: str, restype=None, argtypes=None):
    """The C library's function ``name``, or None where this process's C library lacks it."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):
        return None
    if restype is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


_MALLOC_TRIM = _libc("malloc_trim")  # glibc only
_PR_SET_THP_DISABLE = 41  # linux/prctl.h, Linux 3.15+
_PR_GET_THP_DISABLE = 42
_PRCTL = _libc("prctl", ctypes.c_int, [ctypes.c_int] + [ctypes.c_ulong] * 4)


def set_huge_pages(enabled: bool) -> bool:
    """Allow (True) or forbid (False) transparent huge pages for this process's memory (on
    Linux before 5.0, its new mappings only) and for the processes it starts
    (``prctl(PR_SET_THP_DISABLE)``; Linux only). Returns whether the setting took; False where
    the system has no such switch.

    NumPy and Arrow's allocator ask for huge pages for large buffers. On a virtual machine whose
    host reclaims the guest's free memory (free page reporting), a huge page faulting in can
    cost milliseconds, several times more per byte than small pages: the ``chainrows`` command
    forbids them for its own process (docs/limits.md "Huge pages")."""
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_THP_DISABLE, 0 if enabled else 1, 0, 0, 0) == 0


HUGE_PAGES_ENV = "CHAINROWS_HUGE_PAGES"
HUGE_PAGES_CHOICES = ("off", "system")  # off: forbidden in chainrows' own processes; system: left alone


def apply_huge_pages_choice(environ=None) -> str | None:
    """In a process chainrows owns (the command's, a Ray worker of a chainrows run): forbid
    transparent huge pages (:func:`set_huge_pages`) unless ``CHAINROWS_HUGE_PAGES=system`` keeps
    the system's setting (case and surrounding blanks ignored; empty is unset). ``environ``:
    default ``os.environ``. Returns the error for any other value (nothing changed), else None."""
    given = (os.environ if environ is None else environ).get(HUGE_PAGES_ENV, "")
    value = given.strip().lower() or "off"  # empty: unset, as CHAINROWS_DEBUG
    if value not in HUGE_PAGES_CHOICES:
        return f"{HUGE_PAGES_ENV}={given!r}: expected one of {', '.join(HUGE_PAGES_CHOICES)}"
    if value == "off":
        set_huge_pages(False)
    return None


def huge_pages_enabled() -> bool | None:
    """False when this process forbids itself transparent huge pages (:func:`set_huge_pages`),
    True when it does not (the system's own setting, which may be ``never``, still applies),
    None where the system has no such switch."""
    if _PRCTL is None:
        return None
    forbidden = _PRCTL(_PR_GET_THP_DISABLE, 0, 0, 0, 0)
    return None if forbidden < 0 else forbidden == 0


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


class NoPandas:
    """A meta path finder that refuses to import pandas (:func:`keep_pandas_out`)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is kept out of this chainrows process", name=name)
        return None


def keep_pandas_out() -> NoPandas | None:
    """In a process chainrows owns (the command's, a Ray worker of a chainrows run), while pandas
    is not imported: a :class:`NoPandas` finder put first in ``sys.meta_path`` (a later ``import
    pandas`` fails, and pyarrow does without it), returned so that a caller may remove it; else
    None. pyarrow imports pandas, when it is installed, on the first ``pa.array`` call, only to
    ask whether the argument is a pandas object: 0.2-0.4 s and ~30 MB of resident memory per
    process (docs/decisions-io.md "pandas")."""
    if "pandas" in sys.modules or any(isinstance(f, NoPandas) for f in sys.meta_path):
        return None
    finder = NoPandas()
    sys.meta_path.insert(0, finder)
    return finder
