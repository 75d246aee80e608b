"""``python -m chainrows ...``: the same as the ``chainrows`` command."""

import signal
import sys

_TERMINATED = []


def _terminated_early(signum, frame):
    """SIGTERM while the command's module loads (before chainrows.cli handles it): as later."""
    _TERMINATED.append(signum)
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated_early)
    try:  # an interrupt while the command's own module loads: the same line and code as later
        from chainrows.cli import console_main
    except KeyboardInterrupt:
        print(f"chainrows: {'terminated (SIGTERM)' if _TERMINATED else 'interrupted'}; no output written",
              file=sys.stderr)
        sys.exit(143 if _TERMINATED else 130)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # chainrows.cli installs its own
    sys.exit(console_main())
