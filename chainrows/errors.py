"""The exceptions the CLI turns into one line: InputError, unusable input (SPEC §7: exit 2),
and WriteError, an output file that could not be written (``writing`` names the file)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


class InputError(Exception):
    """Unusable input: a missing table or column, a wrong type, a null where none is allowed,
    an unreadable file, a malformed JSON line.

    ``str(err)`` is exactly one line, ``"<table>: <what> (file <path>)"`` (``(directory
    <path>)`` when the problem is a directory's content), naming the column, row, line or
    rollout where known. The parts are also kept as attributes (``table``, ``file``,
    ``column``, ``row``, ``line``) for callers that want them; they may be None.
    """

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        file: str | Path | None = None,
        column: str | None = None,
        row: int | None = None,
        line: int | None = None,
        directory: str | Path | None = None,
    ):
        self.table = table
        self.file = None if file is None and directory is None else str(file or directory)
        self.column = column
        self.row = row
        self.line = line
        self.reason = message
        text = f"{table}: {message}" if table else str(message)
        if file is not None:
            text = f"{text} (file {file})"
        elif directory is not None:
            text = f"{text} (directory {directory})"
        super().__init__(" ".join(text.split()))  # one line whatever the parts hold


class WriteError(OSError):
    """Writing the output file ``filename`` failed with the OS error ``errno`` (disk full,
    quota, file-size limit, I/O error, permission). ``str(err)`` is one line naming both:
    ``cannot write <file>: <strerror>``."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


@contextmanager
def writing(path: str | os.PathLike):
    """Within the block, an OSError becomes a WriteError naming the file it names, else
    ``path``. pyarrow's write errors name no file (``Error writing bytes to file. Detail:
    [errno 28] ...``), nor do Python's when a buffered write or close fails."""
    try:
        yield
    except WriteError:
        raise
    except OSError as exc:
        raise write_error(exc, path) from exc


def write_error(exc: OSError, path: str | os.PathLike) -> WriteError:
    """``exc`` as the WriteError ``writing`` raises: naming the file ``exc`` names, else
    ``path`` (for a write too hot for a ``with`` block per call; raise it ``from exc``)."""
    if isinstance(exc, WriteError):
        return exc
    return WriteError(exc.errno, os_message(exc), str(exc.filename or path))


def os_message(exc: OSError) -> str:
    """The OS's one-line text for ``exc``'s errno (pyarrow's own wording, which names neither
    file nor call, only when there is no errno)."""
    return os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())
