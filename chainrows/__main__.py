"""``python -m chainrows ...``: the same as the ``chainrows`` command."""

import sys

from chainrows.cli import main

if __name__ == "__main__":
    sys.exit(main())
