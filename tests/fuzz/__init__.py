"""The fuzz campaign (docs/fuzz.md): seeded families of hostile input run through the CLI, every
case checked for no signal death, no traceback, no partial output, no stray write, no modified
input and, where there is one, output equal to the reference's. ``python -m tests.fuzz``."""
