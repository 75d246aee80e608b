"""The test suite (tests/README.md): a package, so its helpers import as ``tests.support.*``."""
