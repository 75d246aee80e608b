"""Output directories (SPEC §4, §7): atomic `rows`/`report` (or any named outputs), the overwrite
policy, locks and fsync. The Parquet writer options are :mod:`chainrows.outdir.parquet`'s.

``AtomicOutput(out_dir)`` stages everything in a hidden temp directory inside ``out_dir`` and
moves the finished tables into place only when the ``with`` block exits normally. On any
exception (KeyboardInterrupt included) the temp directory is deleted and earlier outputs are
left untouched. A run killed with SIGKILL leaves its temp directory behind; the next
``AtomicOutput`` on that ``out_dir`` removes it (an flock on ``.lock`` tells live runs from dead
ones; a dir killed before it held its lock is told by the dead pid in its name). Readers skip
the temp directory anyway: its name starts with ``.``. One ``AtomicOutput`` at a time per
``out_dir``: a second (another process writing the same OUT, which would clobber the first's
work directory and commit) is an InputError while the first holds ``.chainrows-lock``.

Commit order: old ``report`` out, old ``rows`` out, new ``rows`` in, new ``report`` in (each a
single ``rename``). So a ``report`` present in ``out_dir`` always belongs to the ``rows`` next
to it: the report is the commit marker. The only window is between those renames
(microseconds): a crash there leaves a complete new ``rows`` and no ``report``.

``check_destination`` is the one overwrite policy of every command that writes: the commit
marker (the last name committed) in ``out_dir`` means a complete result, refused unless asked
to overwrite; leftovers of interrupted runs never are; output and input never nest.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from chainrows.errors import writing
from chainrows.outdir.parquet import write_parquet

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: stale temp dirs are cleaned by age only
    fcntl = None

TMP_PREFIX = ".chainrows-tmp-"
LOCK_NAME = ".lock"
OUT_LOCK_NAME = ".chainrows-lock"  # held by the AtomicOutput writing out_dir, removed after
STALE_AGE_S = 3600.0          # a temp dir without a lock file is stale after this (or no fcntl)
PART_DIGITS = 8               # part-00000000.parquet: lexicographic order = write order
OUTPUT_NAMES = ("rows", "report")


_listeners: list[Callable[[Path], None]] = []


@contextmanager
def on_commit(listener: Callable[[Path], None]) -> Iterator[None]:
    """Within the block, ``listener(out_dir)`` is called (on the committing thread) the moment
    a commit into ``out_dir`` is complete: its last output (the marker) renamed into place. The
    CLI uses it to tell an interrupt before the commit (exit 130) from one after (exit 0)."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def notify_committed(out_dir: str | os.PathLike) -> None:
    """Tell the :func:`on_commit` listeners that ``out_dir``'s outputs are committed (for a
    writer that commits by renames of its own rather than through AtomicOutput)."""
    for listener in tuple(_listeners):
        listener(Path(out_dir))


# ----------------------------------------------------------------------------- small files

def write_json_atomic(path: str | os.PathLike, value) -> Path:
    """Write ``value`` as JSON to ``path`` through a temp file and one rename: a reader sees
    the old file or the whole new one (a job's manifest and its finished-batch markers)."""
    import json

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with writing(tmp):
        tmp.write_text(json.dumps(value, sort_keys=True))
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- where to write

class OutputExistsError(FileExistsError):
    """``out_dir`` already holds a complete result (``marker``, the last name an
    :class:`AtomicOutput` commits) and the caller did not ask to replace it."""

    def __init__(self, out_dir: Path, marker: Path):
        self.out_dir, self.marker = out_dir, marker
        super().__init__(f"{out_dir} already holds a complete result ({marker.name})")


def check_destination(out_dir: str | os.PathLike, names: Iterable[str] = OUTPUT_NAMES, *,
                      inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False) -> Path:
    """The one overwrite policy of every command that writes: may ``out_dir`` receive the
    outputs ``names`` (committed in that order by :class:`AtomicOutput`)? Returns it as a Path.

    - ``out_dir`` or an input that is empty or blank (as a path it would be the current
      directory): InputError.
    - An input and ``out_dir`` may not nest: ``out_dir`` is never an input, inside an input, or
      (for a directory input) around one. InputError.
    - ``out_dir`` existing as something other than a directory: InputError.
    - ``out_dir`` holding a complete result, i.e. the last of ``names`` (the commit marker, as
      ``<name>.parquet`` or ``<name>/``): OutputExistsError unless ``overwrite``.
    - Anything an interrupted run leaves (staging dirs, ``.chainrows-work``, an empty
      ``out_dir``, ``rows`` without its ``report``) is never a reason to refuse: the run
      resumes or replaces it. Other entries of ``out_dir`` are never touched.
    """
    from chainrows.errors import InputError

    inputs = tuple(inputs)
    for given in (out_dir, *inputs):
        if not os.fspath(given).strip():
            raise InputError(f"an empty or blank path: {os.fspath(given)!r}")
    out = Path(out_dir)
    where = out.resolve()
    for given in inputs:
        inp = Path(given).resolve()
        if where == inp:
            raise InputError(f"output {out} is the input {given}: write it elsewhere")
        if inp in where.parents:
            raise InputError(f"output {out} is inside the input {given}: write it elsewhere")
        if inp.is_dir() and where in inp.parents:
            raise InputError(f"output {out} holds the input {given}: write it elsewhere")
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory")
    marker = tuple(names)[-1]
    for form in (f"{marker}.parquet", marker):
        if not overwrite and os.path.lexists(out / form):
            raise OutputExistsError(out, out / form)
    return out


# ----------------------------------------------------------------------------- atomic output

class AtomicOutput:
    """Context manager staging ``names`` (default ``rows``, ``report``) and committing them
    into ``out_dir`` atomically on success, or discarding them on any exception.

    Each name is written in exactly one form: a single file ``<name>.parquet``
    (:meth:`write_table`, or a writer of the caller's own on :meth:`reserve_file`) or a directory ``<name>/`` of part files
    (:meth:`write_part` / :meth:`reserve_part`). Every name must be written before commit
    (write an empty table for an empty output). Committing replaces both forms of every name
    in ``out_dir``; other entries of ``out_dir`` are never touched.
    """

    def __init__(self, out_dir: str | os.PathLike, names: Iterable[str] = OUTPUT_NAMES, *,
                 durable: bool = True, remove_after_commit: Iterable[str | os.PathLike] = ()):
        """``remove_after_commit``: paths (a run's work directory) deleted once the outputs are
        committed, while the lock on ``out_dir`` is still held, so a run that takes the lock
        next never sees them vanish under it."""
        self.out_dir = Path(out_dir)
        self.remove_after_commit = tuple(Path(p) for p in remove_after_commit)
        self.names = tuple(names)
        self.durable = durable
        self.tmp_dir: Path | None = None
        self._lock_fd: int | None = None
        self._out_lock: int | None = None
        self._modes: dict[str, str] = {}
        self._parts: dict[str, int] = {}
        self._mutex = threading.Lock()
        self.committed = False
        self._created = False

    # -- lifecycle
    def __enter__(self) -> AtomicOutput:
        self._created = not self.out_dir.exists()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._out_lock = _lock_out_dir(self.out_dir)
        try:
            clean_stale_temp_dirs(self.out_dir)
            self.tmp_dir, self._lock_fd = _make_locked_temp_dir(self.out_dir)
        except BaseException:
            self.abort()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()
        return False

    def abort(self) -> None:
        """Discard everything staged (idempotent); outputs already in out_dir stay."""
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None
        self._release()
        if self._created:  # an out_dir this run made, left empty: remove it
            try:
                self.out_dir.rmdir()
            except OSError:
                pass

    def commit(self) -> None:
        """Move the staged outputs into out_dir (report last). Called by ``__exit__``."""
        tmp = self._require_open()
        missing = [n for n in self.names if n not in self._modes]
        if missing:
            raise RuntimeError(f"AtomicOutput: output(s) {missing} were never written")
        staged = {n: tmp / self._staged_name(n) for n in self.names}
        if self.durable:
            for path in staged.values():
                _fsync_tree(path)
        trash = tmp / ".old"
        trash.mkdir()
        moved: list[str] = []
        placed: list[str] = []
        try:
            for name in reversed(self.names):  # report out first: no report without its rows
                for form in (f"{name}.parquet", name):
                    if os.path.lexists(self.out_dir / form):
                        os.replace(self.out_dir / form, trash / form)
                        moved.append(form)
            for name in self.names:  # rows in first, report last
                os.replace(staged[name], self.out_dir / staged[name].name)
                placed.append(staged[name].name)
            notify_committed(self.out_dir)  # inside: an interrupt before it undoes the commit
        except BaseException:
            _undo(self.out_dir, trash, moved, placed)
            raise
        if self.durable:
            _fsync_dir(self.out_dir)
        self.committed = True
        shutil.rmtree(tmp, ignore_errors=True)
        self.tmp_dir = None
        for path in self.remove_after_commit:
            shutil.rmtree(path, ignore_errors=True)
        self._release()

    # -- writing
    def write_table(self, name: str, table: pa.Table, **options) -> Path:
        """Stage ``table`` as the single file ``<name>.parquet``."""
        path = self._claim(name, "file")
        return write_parquet(path, table, **options)

    def reserve_file(self, name: str) -> Path:
        """Path of the single file ``<name>.parquet`` in the temp dir, for callers that write
        it themselves (it must be complete and closed before the ``with`` block ends)."""
        return self._claim(name, "file")

    def reserve_part(self, name: str) -> Path:
        """Path of the next part file ``<name>/part-NNNNNNNN.parquet`` (thread-safe), for
        callers (e.g. worker processes) that write the file themselves."""
        with self._mutex:
            folder = self._claim(name, "parts")
            index = self._parts.get(name, 0)
            if index >= 10 ** PART_DIGITS:
                raise RuntimeError(f"too many part files for {name!r}")
            self._parts[name] = index + 1
        return folder / f"part-{index:0{PART_DIGITS}d}.parquet"

    def write_part(self, name: str, table: pa.Table, **options) -> Path:
        """Stage ``table`` as the next part file of the directory ``<name>/``."""
        return write_parquet(self.reserve_part(name), table, **options)

    # -- internals
    def _require_open(self) -> Path:
        if self.tmp_dir is None:
            raise RuntimeError("AtomicOutput is not open (use it as a context manager)")
        return self.tmp_dir

    def _staged_name(self, name: str) -> str:
        return f"{name}.parquet" if self._modes[name] == "file" else name

    def _claim(self, name: str, mode: str) -> Path:
        tmp = self._require_open()
        if name not in self.names:
            raise ValueError(f"unknown output {name!r}; expected one of {self.names}")
        had = self._modes.get(name)
        if had == "file" or (had is not None and had != mode):
            raise ValueError(f"output {name!r} was already written as "
                             f"{'a single file' if had == 'file' else 'part files'}")
        self._modes[name] = mode
        if mode == "file":
            return tmp / f"{name}.parquet"
        (tmp / name).mkdir(exist_ok=True)
        return tmp / name

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        if self._out_lock is not None:
            _unlock_out_dir(self.out_dir, self._out_lock)
            self._out_lock = None


def _undo(out_dir: Path, trash: Path, moved: list[str], placed: list[str]) -> None:
    """Best-effort rollback of a commit interrupted between renames: restore old outputs."""
    for form in placed:  # the staged copy is discarded with the temp dir anyway
        path = out_dir / form
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for form in moved:
        try:
            os.replace(trash / form, out_dir / form)
        except OSError:
            pass


# ----------------------------------------------------------------------------- temp dirs

def _flock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created if missing), or None when the file
    was unlinked or replaced between our open and our lock (the caller retries). Raises
    BlockingIOError when another process holds it."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except FileNotFoundError:
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _lock_out_dir(out_dir: Path) -> int | None:
    """flock ``out_dir/.chainrows-lock``; InputError when another run holds it."""
    from chainrows.errors import InputError

    if fcntl is None:
        return None
    for _ in range(100):
        try:
            fd = _flock(out_dir / OUT_LOCK_NAME)
        except BlockingIOError:
            raise InputError("another chainrows run is writing to this directory; wait for it "
                             "to end, or write elsewhere", directory=out_dir) from None
        if fd is not None:
            return fd
    raise RuntimeError(f"could not lock {out_dir / OUT_LOCK_NAME}")


def _unlock_out_dir(out_dir: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then release it."""
    try:
        path = out_dir / OUT_LOCK_NAME
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    except OSError:
        pass
    os.close(fd)


def _make_locked_temp_dir(out_dir: Path) -> tuple[Path, int | None]:
    """Create ``.chainrows-tmp-<pid>-<rand>/`` holding an flock'ed ``.lock``. Retries if a
    concurrent cleaner removed it between creation and locking."""
    for _ in range(100):
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=out_dir))
        lock = tmp / LOCK_NAME
        if fcntl is None:
            return tmp, os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fd = _flock(lock)
        except (FileNotFoundError, BlockingIOError):  # a cleaner's doing: retry (out of room is not)
            fd = None
        if fd is not None:
            return tmp, fd
        shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"could not create a temp directory in {out_dir}")


def clean_stale_temp_dirs(out_dir: str | os.PathLike) -> list[Path]:
    """Remove temp dirs left in ``out_dir`` by killed runs; live runs' dirs stay (their lock
    is held). Returns the removed paths. Errors are ignored (best effort)."""
    removed = []
    try:
        entries = [e for e in os.scandir(out_dir) if e.name.startswith(TMP_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and _remove_if_stale(Path(entry.path)):
            removed.append(Path(entry.path))
    return removed


def _remove_if_stale(tmp: Path) -> bool:
    lock = tmp / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:  # not yet locked, or died before locking
        # A writer is without its lock only between mkdtemp and flock (microseconds), so a
        # lock-less dir whose creator (the pid in its name) is gone is stale now; a SIGKILL in
        # that window used to leave the dir for an hour. Otherwise judge by age.
        if _creator_gone(tmp) or time.time() - _mtime(tmp) > STALE_AGE_S:
            shutil.rmtree(tmp, ignore_errors=True)
            return True
        return False
    except OSError:
        return False
    try:
        if fcntl is None:
            stale = time.time() - _mtime(tmp) > STALE_AGE_S
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                stale = True
            except OSError:
                stale = False  # a live run holds it
        if stale:
            shutil.rmtree(tmp, ignore_errors=True)
        return stale
    finally:
        os.close(fd)


def _creator_gone(tmp: Path) -> bool:
    """True when the pid in ``.chainrows-tmp-<pid>-<rand>`` names no live process (a reused
    pid only makes this say False: the dir then waits for STALE_AGE_S, the safe direction)."""
    try:
        pid = int(tmp.name[len(TMP_PREFIX):].split("-", 1)[0])
    except ValueError:
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists (e.g. another user's process) or cannot tell
        return False
    return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def fsync_file(path) -> None:
    """Flush one written file to disk (errors raised, a WriteError naming it: a file that cannot
    be synced is not durable, and a full disk may first show here)."""
    with writing(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            _fsync_tree(child)
        _fsync_dir(path)
    else:
        fsync_file(path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
