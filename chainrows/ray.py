"""Deprecated: use chainrows.runners.ray (``chainrows.runners.ray.reassemble``)."""

from chainrows.io import moved

moved(globals(), "chainrows.runners.ray")
