"""Deprecated: use chainrows.formats.items."""

from chainrows.io import moved

moved(globals(), "chainrows.formats.items")
