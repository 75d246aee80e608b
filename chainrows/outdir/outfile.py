"""``OutFile``: a plain Python file opened for writing (JSON Lines, bucket files) whose every
failure is a WriteError naming it, as the Arrow and Parquet writers' are
(chainrows.errors.writing).

Python names the file only when ``open`` fails: a full disk or the file-size limit shows on a
later ``write`` (when the buffer is flushed) or on ``close``, as ``[Errno 28] No space left on
device`` with no file name, which the CLI cannot tell from unusable input.
"""

from __future__ import annotations

import os
from pathlib import Path

from chainrows.errors import write_error, writing


class OutFile:
    """``open(path, mode, **kwargs)`` for writing, as a context manager; ``write`` is the
    file's. Opening, writing and closing raise a WriteError naming ``path`` on an OSError.
    Leaving the block normally closes the file (its buffered bytes are written then, so a
    full disk may first show there). Leaving it on an exception releases the file, and a
    failure of that close (the same full disk, flushing what is buffered) is dropped: the
    first error stands. The caller removes a file it does not keep."""

    def __init__(self, path: str | os.PathLike, mode: str = "wb", **kwargs):
        self.path = Path(path)
        with writing(self.path):
            self._file = open(self.path, mode, **kwargs)

    def write(self, data):
        try:
            return self._file.write(data)
        except OSError as exc:
            raise write_error(exc, self.path) from exc

    def close(self) -> None:
        """Flush and close (idempotent); a failure is a WriteError naming the file."""
        with writing(self.path):
            self._file.close()

    def discard(self) -> None:
        """Release the file after an error: a failure to flush or close is dropped."""
        try:
            self._file.close()
        except OSError:
            pass

    def __enter__(self) -> OutFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()
