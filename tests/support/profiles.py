"""Example counts relative to the loaded hypothesis profile (tests/conftest.py)."""

from __future__ import annotations

import math

from hypothesis import settings


def examples(scale: float) -> int:
    """``scale`` times the profile's ``max_examples`` (at least 1): for a property that needs
    more examples than the others (cheap, or with a large input space) or fewer (slow)."""
    return max(1, math.ceil(settings.default.max_examples * scale))
