"""A writer that writes on its own thread, so encoding overlaps the caller's next batch."""

from __future__ import annotations

import queue
import threading

_DONE = object()


class BackgroundWriter:
    """Wraps a writer (``write(table)``, ``close()``): ``write`` hands the table to a thread
    (at most ``depth`` waiting), ``close`` waits for it and closes the writer. An error on the
    thread is raised by the next ``write`` or ``close``. A context manager; close is idempotent.

    Parquet encoding and compression release the GIL, so the caller's gather and the writer's
    encoding run on two cores.
    """

    def __init__(self, writer, depth: int = 1):
        self.writer = writer
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="chainrows-writer", daemon=True)
        self._thread.start()
        self._closed = False

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if self._error is None:
                try:
                    self.writer.write(item)
                except BaseException as exc:  # handed to the caller
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, table) -> None:
        self._raise()
        self._queue.put(table)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_DONE)
        self._thread.join()
        if self._error is not None:  # release the wrapped writer, then raise the thread's error
            self.writer.__exit__(type(self._error), self._error, None)
            raise self._error
        self.writer.close()

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            self._queue.put(_DONE)
            self._thread.join()
            self.writer.__exit__(exc_type, exc, tb)
