"""``python -m chainrows.cli ...``: the same as the ``chainrows`` command.

Python imports the package ``chainrows.cli`` before this module runs, so an early SIGTERM
handler here would come after the imports it is meant to cover; ``python -m chainrows``
(chainrows/__main__.py) installs one before importing anything."""

import sys

from chainrows.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())
