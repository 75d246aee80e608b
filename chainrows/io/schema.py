"""Deprecated: use chainrows.formats.native.schema."""

from chainrows.io import moved

moved(globals(), "chainrows.formats.native.schema")
