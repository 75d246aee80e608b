"""``python -m chainrows ...``: the same as the ``chainrows`` command."""

import sys

if __name__ == "__main__":
    try:  # an interrupt while the command's own module loads: the same line and code as later
        from chainrows.cli import console_main
    except KeyboardInterrupt:
        print("chainrows: interrupted; no output written", file=sys.stderr)
        sys.exit(130)
    sys.exit(console_main())
