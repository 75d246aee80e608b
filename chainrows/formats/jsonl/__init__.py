"""Raw JSON Lines captures (docs/jsonl.md): :mod:`~chainrows.formats.jsonl.importer` turns the
three files into SPEC §2 tables (``chainrows import-jsonl``); :mod:`~chainrows.formats.jsonl.lines`
is the line parser and the field readers other JSON formats (NeMo Gym) reuse."""

from chainrows.formats.jsonl.importer import (
    import_jsonl,
    import_jsonl_to_dataset,
    read_ledger_jsonl,
    read_results_jsonl,
    read_tokens_jsonl,
)

__all__ = ["import_jsonl", "import_jsonl_to_dataset", "read_ledger_jsonl", "read_results_jsonl",
           "read_tokens_jsonl"]
