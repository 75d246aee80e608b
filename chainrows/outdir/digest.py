"""Content digests of the files a job keeps for ``--resume`` (runs, spilled parts).

Kept files are not fsynced, and after a machine crash a file can keep its size and its
footer while a page in its middle reads back as zeros: only a digest of every byte tells it
from the file that was written.
"""

from __future__ import annotations

import os

import xxhash

PIECE_BYTES = 8 << 20


def file_digest(path: str | os.PathLike) -> str:
    """XXH3-64 of the file's bytes as 16 hex digits, read ``PIECE_BYTES`` at a time (a file
    just written is read back from the page cache, never held whole in memory)."""
    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size < PIECE_BYTES:  # most spilled parts: one read, no buffer
            h.update(f.read())
        else:
            piece = memoryview(bytearray(PIECE_BYTES))
            while n := f.readinto(piece):
                h.update(piece[:n])
    return h.hexdigest()
