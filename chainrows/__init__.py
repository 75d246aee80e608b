"""chainrows: token-exact RL training rows from captured LLM-agent calls, context compaction included."""

__version__ = "0.1.0"
