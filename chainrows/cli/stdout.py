"""A command's summary on stdout, printed once its outputs are committed.

``print_summary`` flushes what it printed, so a stdout that cannot be written fails there, not
at interpreter exit (where Python only reports 'Exception ignored' and exits 120). A reader
that left (``| head``) stays a BrokenPipeError (the CLI exits 141); any other failure (a full
disk, ``> /dev/full``, the file-size limit) is a StdoutError (the CLI exits 1 and says the
outputs are committed). Neither is the input's fault.
"""

from __future__ import annotations

import os
import sys

from chainrows.errors import os_message


class StdoutError(OSError):
    """stdout could not be written, with the OS error ``errno``; ``str(err)`` is one line,
    ``cannot write stdout: <strerror>``."""

    def __str__(self) -> str:
        return f"cannot write stdout: {self.strerror}"


def print_summary(*lines: str) -> None:
    """Print ``lines`` on stdout and flush them. Raises BrokenPipeError when stdout's reader
    left, StdoutError on any other failure to write; nothing when there is no stdout."""
    try:
        for line in lines:
            print(line)
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(exc.errno, os_message(exc)) from exc


def detach_stdout() -> None:
    """Point fd 1 at /dev/null after stdout failed, so the interpreter's flush at exit (of what
    is still buffered) raises nothing more."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass
