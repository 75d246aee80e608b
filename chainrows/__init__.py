"""chainrows: token-exact RL training rows from captured LLM-agent calls, context compaction included."""

__version__ = "0.1.0"

__all__ = ["Result", "batches", "explain", "import_calls", "reassemble", "__version__"]


def __getattr__(name):
    # Lazy: `chainrows --help` and `import chainrows.reasons` need not import numba (~0.4 s).
    if name in ("Result", "reassemble"):
        from chainrows import api

        return getattr(api, name)
    if name == "explain":  # one rollout, call by call (docs/explain.md)
        from chainrows.explanation import explain

        return explain
    if name == "import_calls":  # a full-sequence call log -> a dataset (docs/calls.md)
        from chainrows.formats import calls

        return calls.import_calls
    if name == "batches":  # padded numpy batches for trainers (numpy + pyarrow, no numba)
        import importlib

        return importlib.import_module("chainrows.batches")
    raise AttributeError(f"module 'chainrows' has no attribute {name!r}")
