"""The chain hash of SPEC §2, ``ledger.chain_hash``: XXH3-64 of a call's delta tokens as
little-endian int32 bytes, seeded with the parent's chain_hash (0 for a root).

The one definition every non-oracle user computes it with (the importers, the synthesizer, the
bulk runner's warm-up, the output checker). The engine's kernel (``chainrows.engine.xxh3``) and
the reference oracle (``chainrows.reference``) keep their own on purpose: each is tested
against the other and must not share code with it."""

from __future__ import annotations

import numpy as np
import xxhash


def chain_hash(tokens, seed: int = 0) -> int:
    """``ledger.chain_hash`` of a delta: ``tokens`` (a sequence of ints, or an integer array)
    hashed as little-endian int32 bytes with XXH3-64 seeded by ``seed`` (the parent's
    chain_hash; 0 for a root)."""
    return xxhash.xxh3_64_intdigest(np.asarray(tokens, dtype="<i4").tobytes(), seed)
