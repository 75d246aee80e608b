"""Deprecated: use chainrows.formats.gym."""

from chainrows.io import moved

moved(globals(), "chainrows.formats.gym")
