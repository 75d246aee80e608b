"""Deprecated: use chainrows.runners.bulk."""

from chainrows.io import moved

moved(globals(), "chainrows.runners.bulk")
