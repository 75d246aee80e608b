"""chainrows.engine.streamcopy against its plain-Python definition: every destination
alignment, lengths around the head / whole lines / tail boundaries, each dtype the engine
streams with its bits kept (NaN payloads too), and nothing outside the range written."""

import numpy as np
import pytest
from numba.core.errors import TypingError

from chainrows.engine.jit import jit
from chainrows.engine.streamcopy import (
    NEVER,
    STREAM_MIN_BYTES,
    STREAM_MIN_OUTPUT_BYTES,
    store_fence,
    stream_copy,
    stream_copy_py,
    stream_from,
)


@jit(cache=False)  # Numba's cache would not see a change to streamcopy.py, only to this file
def _stream(dst, d0, src, s0, n):
    stream_copy(dst, d0, src, s0, n)
    store_fence()


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.uint32, np.float32, np.int64])
def test_stream_copy_equals_the_plain_copy_at_every_alignment(dtype):
    rng = np.random.default_rng(7)
    width = np.dtype(dtype).itemsize
    lines = 64 // width
    lengths = sorted({0, 1, 2, 3, lines - 1, lines, lines + 1, 2 * lines - 1, 2 * lines, 2 * lines + 1,
                      3 * lines + 5, STREAM_MIN_BYTES // width - 1, STREAM_MIN_BYTES // width,
                      STREAM_MIN_BYTES // width + 1, 1000, 4099})
    raw = rng.integers(0, 256, 6000 * width, dtype=np.uint8)  # NaN bit patterns too
    src = raw.view(dtype)
    for n in lengths:
        for d0 in range(lines + 1):  # every offset within a 64-byte line, and one more
            s0 = int(rng.integers(0, 1000))
            got = np.full(5200 * width, 0xA5, dtype=np.uint8).view(dtype)
            want = got.copy()
            _stream(got, d0, src, s0, n)
            stream_copy_py(want, d0, src, s0, n)
            assert got.tobytes() == want.tobytes(), (n, d0, s0)


def test_stream_copy_reads_read_only_and_misaligned_arrays():
    # the engine's sources are read-only views; a uint8 buffer viewed at an odd offset gives
    # values whose addresses are not multiples of their width
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, 40_000, dtype=np.uint8)
    src = np.frombuffer(raw.tobytes(), dtype=np.int32, offset=1, count=9000)  # read-only, misaligned
    assert not src.flags.writeable and src.ctypes.data % 4 != 0
    out_raw = np.zeros(40_000, dtype=np.uint8)
    got = out_raw[3:3 + 4 * 9000].view(np.int32)  # a writable misaligned destination
    want = np.zeros(9000, dtype=np.int32)
    for n, d0, s0 in [(0, 0, 0), (5, 1, 2), (300, 7, 11), (4000, 13, 100), (8000, 2, 999)]:
        _stream(got, d0, src, s0, n)
        stream_copy_py(want, d0, src, s0, n)
        assert got.tobytes() == want.tobytes(), (n, d0, s0)


def test_runs_stream_from_512_bytes_into_outputs_past_a_last_level_cache():
    assert stream_from(STREAM_MIN_OUTPUT_BYTES) == STREAM_MIN_BYTES == 512
    assert stream_from(STREAM_MIN_OUTPUT_BYTES - 1) == NEVER
    assert stream_from(0) == NEVER


def test_stream_copy_refuses_what_it_cannot_copy_bit_for_bit():
    with pytest.raises(TypingError, match="integer or float"):
        _stream(np.zeros(8, np.bool_), 0, np.zeros(8, np.bool_), 0, 4)
    with pytest.raises(TypingError, match="differ in dtype"):
        _stream(np.zeros(8, np.int32), 0, np.zeros(8, np.float32), 0, 4)
    with pytest.raises(TypingError, match="C-contiguous"):
        _stream(np.zeros(16, np.int32)[::2], 0, np.zeros(8, np.int32), 0, 4)
    read_only = np.zeros(8, np.int32)
    read_only.flags.writeable = False
    with pytest.raises(TypingError, match="read-only"):
        _stream(read_only, 0, np.zeros(8, np.int32), 0, 4)
