"""``import-calls`` as a job on files (SPEC §8): a call log read a chunk at a time under a memory
budget, decided by chainrows.formats.calls, its outputs streamed to a dataset directory, all or
nothing; bucketed by rollout when the rollouts' state does not fit (docs/calls.md)."""

from chainrows.runners.calls.job import DEFAULT_BUDGET, import_calls_to_dataset

__all__ = ["DEFAULT_BUDGET", "import_calls_to_dataset"]
