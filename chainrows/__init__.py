"""chainrows: token-exact RL training rows from captured LLM-agent calls, context compaction included."""

__version__ = "0.1.0"

from chainrows.api import Result, reassemble  # noqa: E402

__all__ = ["Result", "reassemble", "__version__"]
