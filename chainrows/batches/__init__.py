"""numpy batches of the ``rows`` table for a trainer (numpy and pyarrow only, no new dependency).

- padded, one row per line of a ``(B, T)`` array: :func:`iter_batches`, :func:`collate`,
  :func:`split_prompt_response` (``chainrows/batches/padded.py``);
- packed, rows back to back in one sequence with ``cu_seqlens``, each data-parallel rank its
  own bins: :func:`iter_packed` (``chainrows/batches/packed.py``, the packer in
  ``chainrows/batches/binpack.py``).

docs/trainers.md maps both onto verl, NeMo RL, OpenRLHF and TRL.
"""

from chainrows.batches.packed import PackedBatches, PackStats, iter_packed
from chainrows.batches.padded import Batch, collate, iter_batches, plan_batches, rows_files, split_prompt_response

__all__ = ["Batch", "iter_batches", "collate", "plan_batches", "rows_files", "split_prompt_response",
           "iter_packed", "PackedBatches", "PackStats"]
