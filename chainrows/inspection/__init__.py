"""``chainrows inspect``: a reassemble output as one self-contained HTML report (docs/explain.md)."""

from chainrows.inspection.report import write_report

__all__ = ["write_report"]
