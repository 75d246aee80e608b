"""The one exception type for unusable input (SPEC §7: the CLI prints it and exits 2)."""

from __future__ import annotations

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
