"""Helpers shared by the tests, imported explicitly (``from tests.support.builders import ...``).

No test module imports another test module: whatever two test files share lives here."""
