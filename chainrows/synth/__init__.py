"""A seeded simulator of agent harnesses: realistic SPEC §2 datasets as Arrow tables.

Each rollout is one simulated harness loop. Call 1 is a root whose delta is the system + user
prompt (carry) followed by the model's generation; every later call's delta is the observation
since the previous accepted call (tool output, template glue: carry) followed by the generation.
Every call produces 1-3 model-authored Responses-API items (reasoning, then an assistant message
or a function_call); their fingerprints (SPEC §2.1) are the call's ``item_keys``. On top of that:

- **compaction** (probability ``compaction_rate`` per rollout, possibly several): the next call is
  a new root whose delta is a fresh, shorter prompt (system prompt + summary) + generation;
- **rejected retries** (probability ``retry_rate`` per accepted call): a sibling call with the same
  parent and the same carry tokens, different generation and items, captured just before the
  accepted one and absent from the final output;
- the final output is the model-authored items of the accepted calls in order;
  ``terminal_response_id`` names the last accepted call (null for ~15 % of rollouts);
  ``accepted_response_ids`` is present for a share ``accepted_rate``; some item ids are null.
- **corruption** (probability ``corrupt_rate`` per rollout): exactly one corruption, chosen
  uniformly from ``corrupt_kinds``. Kind names are the SPEC §3 reason codes they are built to
  trigger; ``CORRUPT_TARGETS`` gives the mode in which each one triggers its reason
  (``multiple_roots``, ``ambiguous_terminal`` and ``walk_mismatch`` are ordinary-mode reasons:
  the first two are clean in cc mode, ``walk_mismatch`` is ``broken_chain`` there).
- **forest shapes** (SPEC §3.1; ``worker_rate``, ``fork_rate``, both 0 by default; uncorrupted
  rollouts only): 2-4 sub-agent workers, each its own root and chain, their calls interleaved;
  or a fork, one call continued by two interleaved branches. Every accepted call's items are in
  the output in capture order, so these are ``broken_chain`` under the linear plan and ok under
  the forest plan. At rate 0 nothing is drawn: datasets stay byte-identical.

Determinism: rollout ``i`` draws everything from generators seeded with XXH3-128 of
``(seed, i)`` (a counter-based scheme); the GRPO group's prompt and success rate from
``SeedSequence(seed, spawn_key=(1, group))``; the system prompt, shared by all rollouts, from
``(3,)``. Ledger rows of the rollouts of one *block* of ``BLOCK`` consecutive rollouts interleave
a little (capture order kept within a rollout) and token rows are shuffled within a block, with
a generator seeded by ``(2, block)``. Batches are whole blocks (``batch_rollouts`` is rounded up
to a multiple of ``BLOCK``), so the concatenation of all batches is the same for any batch size
or worker count, and a rollout's rows do not depend on ``n_rollouts`` (only the interleaving of
the last, partial block does).

Speed: roughly 1 GB of int32 tokens (~250 M, logprobs on top) per minute and core, Parquet
writing included (Python per call, numpy per rollout); ``workers`` builds batches in several
processes. ``python -m chainrows.synth OUT --rollouts N`` writes a dataset.

Parameters and their defaults: :class:`SynthParams` (``params``). Modules: ``params``, ``calls``
(a call's fields and items), ``harness`` (one rollout), ``corrupt`` (the corruptions),
``tables`` (a batch of Arrow tables), ``batches`` (ranges and workers), ``writer`` (the dataset
files). Only ``params`` is imported with the package; the rest on first use of a name, so the
``chainrows`` parser reads the defaults without loading numpy and pyarrow.
"""

from __future__ import annotations

import importlib

from chainrows.synth.params import BLOCK, CORRUPT_KINDS, CORRUPT_TARGETS, DEFAULT_BATCH_ROLLOUTS, DEFAULTS, SynthParams

__all__ = [
    "BLOCK",
    "CORRUPT_KINDS",
    "CORRUPT_TARGETS",
    "DEFAULT_BATCH_ROLLOUTS",
    "DEFAULTS",
    "SynthParams",
    "iter_synth_batches",
    "synth_tables",
    "tables_schemas",
    "write_synth_dataset",
]

# Where names not imported above live, searched in this order (private names included: tests
# reach the item builders as ``synth._text`` and so on).
_MODULES = ("calls", "harness", "corrupt", "tables", "batches", "writer")


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    for mod in _MODULES:
        module = importlib.import_module(f"{__name__}.{mod}")
        if name in vars(module):
            value = globals()[name] = vars(module)[name]
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_MODULES))
