"""Hypothesis profiles, chosen by the ``HYPOTHESIS_PROFILE`` environment variable:

- ``dev`` (the default): 10 examples per property, a quick run for contributors;
- ``ci``: 100 (hypothesis' own default), what ``.ci/run`` uses; every test's count is at least
  what it was when tests named their own counts;
- ``nightly``: 1000, a hunt for rare bugs.

A test that needs more or fewer examples than the others scales the profile's count
(``tests.support.profiles.examples``) instead of naming a number. No deadline: the first
example of a property may compile Numba kernels."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=10, deadline=None, print_blob=True)
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("nightly", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
