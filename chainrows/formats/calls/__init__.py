"""Full-sequence call logs (SPEC §8, docs/calls.md): infer every call's parent by exact token
prefix, compute the deltas and chain hashes, report where the tokens drifted.

- :func:`import_calls`: a log (an Arrow table, or a file read whole) -> the §2 tables and
  ``import_report`` in memory; the command ``chainrows import-calls`` streams a log of any size
  under a memory budget (chainrows.runners.calls);
- :func:`export_calls`: a consistent §2 dataset written back as the call log a harness that kept
  whole prompts would have logged (to try the import, or to test a round trip);
- :data:`RELATIONS`: the relation codes of ``import_report``.
"""

from chainrows.formats.calls.export import export_calls, write_calls_jsonl, write_results_jsonl
from chainrows.formats.calls.importer import CallsImport, import_calls
from chainrows.formats.calls.infer import RELATIONS
from chainrows.formats.calls.summary import CallsSummary

__all__ = ["CallsImport", "CallsSummary", "RELATIONS", "export_calls", "import_calls", "write_calls_jsonl",
           "write_results_jsonl"]
