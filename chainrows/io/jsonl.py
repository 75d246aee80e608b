"""Deprecated: use chainrows.formats.jsonl.importer and chainrows.formats.jsonl.lines."""

from chainrows.io import moved

moved(globals(), "chainrows.formats.jsonl.importer", "chainrows.formats.jsonl.lines")
