"""chainrows.engine.streamcopy against its plain-Python definition: every destination
alignment, lengths around the head / whole lines / tail boundaries, each dtype the engine
streams with its bits kept (NaN payloads too), and nothing outside the range written."""

import numpy as np
import pytest
from numba.core.errors import TypingError

from chainrows.engine._jit import jit
from chainrows.engine.streamcopy import STREAM_MIN_BYTES, store_fence, stream_copy, stream_copy_py


@jit
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


def test_stream_copy_refuses_what_it_cannot_copy_bit_for_bit():
    with pytest.raises(TypingError, match="integer or float"):
        _stream(np.zeros(8, np.bool_), 0, np.zeros(8, np.bool_), 0, 4)
    with pytest.raises(TypingError, match="differ in dtype"):
        _stream(np.zeros(8, np.int32), 0, np.zeros(8, np.float32), 0, 4)
    with pytest.raises(TypingError, match="C-contiguous"):
        _stream(np.zeros(16, np.int32)[::2], 0, np.zeros(8, np.int32), 0, 4)
