"""``python -m chainrows.cli ...``: the same as the ``chainrows`` command."""

import sys

from chainrows.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())
