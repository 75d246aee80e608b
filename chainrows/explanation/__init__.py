"""``chainrows explain`` and ``chainrows.explain``: why one rollout came out as it did, call by call
(docs/explain.md)."""

from chainrows.explanation.model import Explanation, explain, explain_tables

__all__ = ["Explanation", "explain", "explain_tables"]
