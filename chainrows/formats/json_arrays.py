"""Kernel: the number arrays of JSON Lines records, read without ``json.loads``.

Nearly all the bytes of a record of a token log are a few arrays of numbers at the top level
(token ids, logprobs). :func:`scan` lexes a block of lines once: it follows each line's JSON
structure (strings, nesting) to find the named keys at the top level, and parses their arrays
into flat int64 / float64 buffers. The caller hands the rest of the line, each array replaced by
``0``, to ``json.loads`` (a few hundred bytes), and keeps its exact reader as the authority: a
line the kernel cannot read exactly as ``json.loads`` would is *doubtful* (its status is not
OK) and goes to that reader, which gives its value or its error.

What makes a line doubtful: the first non-blank byte is not ``{``; a named key occurs twice, or
holds a backslash (``"\\u0070rompt_ids"`` is the same key to json.loads); its value is neither an
array nor ``null``; an element is not a JSON number of the field's kind (``NaN``, ``true``,
strings, nesting, ``01``, ``+1``, ``.5``); an integer field's element has a fraction or an
exponent, or more than 18 digits. Float literals: an integer of at most 15 digits, or a decimal
whose mantissa fits 2**53 and whose power of ten is within 22, is computed in one correctly
rounded IEEE operation (Clinger's fast path); every other literal is returned in ``slow`` (its
byte span and slot) for the caller to convert with Arrow's correctly rounded cast
(:func:`convert_slow`).

Two stricter kinds (NeMo Gym's staged lines, chainrows.formats.gym.fast) refuse ``null`` (NOT_ARRAY)
and read the whole number before judging it: ``U64``, integers of at most 19 digits (every u64
below 10**19; a fraction or an exponent is NOT_INT, 20 digits or more BIG_INT) kept mod 2**64 in
the int64 buffer (view it as uint64): a negative one wraps and its field's state is WRAPPED
rather than ARRAY; ``FLOAT_STRICT``, FLOAT whose integer literals of more than 15 digits are
BIG_INT rather than slow.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.grow import grow
from chainrows.engine.jit import jit

INT, FLOAT, U64, FLOAT_STRICT = 0, 1, 2, 3  # field kinds
ABSENT, ARRAY, NULL, WRAPPED = 0, 1, 2, 3  # a field's state in a line
OK, NOT_OBJECT, KEY_ESCAPE, REPEATED, NOT_ARRAY, BAD_NUMBER, BIG_INT, NOT_INT, UNCLOSED = range(9)
REASONS = ("ok", "not an object", "escaped top-level key", "key repeated", "value is not an array",
           "not a JSON number", "integer too long", "not an integer", "unterminated")
POW10 = np.array([10.0 ** k for k in range(23)])  # exact doubles
_TWO53 = np.uint64(1 << 53)


@jit(inline="always")
def _ws(buf, i, end):
    while i < end and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
        i += 1
    return i


@jit(inline="always")
def _digits(buf, i, end):
    """(next index, mantissa of the first 19 significant digits, digits seen) of a run of digits."""
    m = np.uint64(0)
    n = 0
    while i < end and 48 <= buf[i] <= 57:
        if n < 19:
            m = m * np.uint64(10) + np.uint64(buf[i] - 48)
        n += 1
        i += 1
    return i, m, n


@jit(inline="always")
def _number(buf, i, end):
    """Lex one JSON number at i: (next, status, negative, mantissa, significant digits, digits
    after the point counted in the mantissa, exponent, exponent digits, is an integer)."""
    neg = i < end and buf[i] == 45
    if neg:
        i += 1
    if i >= end or buf[i] < 48 or buf[i] > 57:
        return i, BAD_NUMBER, neg, np.uint64(0), 0, 0, 0, 0, True
    if buf[i] == 48:
        i += 1
        if i < end and 48 <= buf[i] <= 57:
            return i, BAD_NUMBER, neg, np.uint64(0), 0, 0, 0, 0, True  # a leading zero
        m, sig = np.uint64(0), 0
    else:
        i, m, sig = _digits(buf, i, end)
    frac, is_int = 0, True
    if i < end and buf[i] == 46:  # '.'
        is_int = False
        i += 1
        if i >= end or buf[i] < 48 or buf[i] > 57:
            return i, BAD_NUMBER, neg, m, sig, 0, 0, 0, False
        while i < end and 48 <= buf[i] <= 57:
            if sig > 0 or buf[i] != 48:
                if sig < 19:
                    m = m * np.uint64(10) + np.uint64(buf[i] - 48)
                    frac += 1
                sig += 1
            else:
                frac += 1  # a leading zero of the fraction
            i += 1
    e, e_digits = 0, 0
    if i < end and (buf[i] == 101 or buf[i] == 69):  # e E
        is_int = False
        i += 1
        eneg = i < end and buf[i] == 45
        if i < end and (buf[i] == 43 or buf[i] == 45):
            i += 1
        if i >= end or buf[i] < 48 or buf[i] > 57:
            return i, BAD_NUMBER, neg, m, sig, frac, 0, 0, False
        while i < end and 48 <= buf[i] <= 57:
            if e_digits < 6:
                e = e * 10 + (buf[i] - 48)
            e_digits += 1
            i += 1
        if eneg:
            e = -e
    return i, OK, neg, m, sig, frac, e, e_digits, is_int


@jit(inline="always")
def _float_value(neg, m, sig, frac, e, e_digits, is_int, pow10):
    """(value, exact): the literal's double when the fast path gives it exactly rounded."""
    if is_int:
        if sig > 15:
            return 0.0, False
        v = float(m)
        return (-v if neg and v != 0.0 else v), True  # the integer -0 is 0, as json.loads gives int 0
    if m == 0 and sig == 0:
        return (-0.0 if neg else 0.0), True
    e10 = e - frac
    if sig <= 19 and e_digits < 6 and m <= _TWO53 and -22 <= e10 <= 22:
        v = float(m) * pow10[e10] if e10 >= 0 else float(m) / pow10[-e10]
        return (-v if neg else v), True
    return 0.0, False


@jit
def _int_array(buf, i, end, ints, n):
    """Parse JSON integers from ``buf[i]`` (just inside '[', not empty) up to the closing ']'
    into ``ints[n:]`` (room for every value the bytes can hold). Returns (next index, status,
    values written); the hot loop of a token log, so no helper calls."""
    while True:
        neg = i < end and buf[i] == 45
        if neg:
            i += 1
        if i >= end or buf[i] < 48 or buf[i] > 57:
            return i, BAD_NUMBER, n
        v = np.int64(0)
        if buf[i] == 48:
            i += 1
            if i < end and 48 <= buf[i] <= 57:
                return i, BAD_NUMBER, n  # a leading zero
        else:
            d = 0
            while i < end and 48 <= buf[i] <= 57:
                v = v * 10 + (buf[i] - 48)
                d += 1
                i += 1
            if d > 18:
                return i, BIG_INT, n
        if i < end and (buf[i] == 46 or buf[i] == 101 or buf[i] == 69):  # . e E
            return i, NOT_INT, n
        ints[n] = -v if neg else v
        n += 1
        while i < end and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
            i += 1
        if i < end and buf[i] == 44:  # ','
            i += 1
            while i < end and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
                i += 1
            continue
        if i < end and buf[i] == 93:  # ']'
            return i + 1, OK, n
        return i, BAD_NUMBER, n


@jit
def _u64_array(buf, i, end, ints, n):
    """As :func:`_int_array`, for the U64 kind: integers of at most 19 digits, mod 2**64.
    Returns (next index, status, values written, a negative one seen)."""
    wrapped = False
    while True:
        i, st, neg, m, sig, frac, e, e_digits, is_int = _number(buf, i, end)
        if st != OK:
            return i, st, n, wrapped
        if not is_int:
            return i, NOT_INT, n, wrapped
        if sig > 19:
            return i, BIG_INT, n, wrapped
        if neg and m != 0:
            wrapped = True
            m = ~m + np.uint64(1)
        ints[n] = m
        n += 1
        i = _ws(buf, i, end)
        if i < end and buf[i] == 44:  # ','
            i = _ws(buf, i + 1, end)
            continue
        if i < end and buf[i] == 93:  # ']'
            return i + 1, OK, n, wrapped
        return i, BAD_NUMBER, n, wrapped


@jit(inline="always")
def _buffer(kind):
    """Which buffer a kind's values go to: INT (``ints``) or FLOAT (``floats``)."""
    return INT if kind == INT or kind == U64 else FLOAT


@jit
def _array(buf, i, end, kind, ints, floats, counts, slow, n_slow, pow10):
    """Parse the array at ``buf[i] == '['`` into ``ints`` or ``floats`` (``counts[_buffer(kind)]``
    values so far). Returns (next index, status, a U64 value wrapped, ints, floats, slow, n_slow)."""
    i = _ws(buf, i + 1, end)
    if i < end and buf[i] == 93:  # ']'
        return i + 1, OK, False, ints, floats, slow, n_slow
    if kind == INT or kind == U64:
        ints = grow(ints, counts[INT] + (end - i) // 2 + 1)  # a value takes at least 2 bytes
        wrapped = False
        if kind == INT:
            i, st, counts[INT] = _int_array(buf, i, end, ints, counts[INT])
        else:
            i, st, counts[INT], wrapped = _u64_array(buf, i, end, ints, counts[INT])
        return i, st, wrapped, ints, floats, slow, n_slow
    floats = grow(floats, counts[FLOAT] + (end - i) // 2 + 1)
    while True:
        n0 = i
        i, st, neg, m, sig, frac, e, e_digits, is_int = _number(buf, i, end)
        if st != OK:
            return i, st, False, ints, floats, slow, n_slow
        if kind == FLOAT_STRICT and is_int and sig > 15:
            return i, BIG_INT, False, ints, floats, slow, n_slow
        v, exact = _float_value(neg, m, sig, frac, e, e_digits, is_int, pow10)
        if not exact:
            slow = grow(slow, 3 * (n_slow + 1))
            slow[3 * n_slow], slow[3 * n_slow + 1], slow[3 * n_slow + 2] = n0, i, counts[FLOAT]
            n_slow += 1
        floats[counts[FLOAT]] = v
        counts[FLOAT] += 1
        i = _ws(buf, i, end)
        if i < end and buf[i] == 44:  # ','
            i = _ws(buf, i + 1, end)
            continue
        if i < end and buf[i] == 93:  # ']'
            return i + 1, OK, False, ints, floats, slow, n_slow
        return i, BAD_NUMBER, False, ints, floats, slow, n_slow


@jit
def _key(buf, q0, q1, names, name_off):
    """Index of the field named buf[q0:q1], or -1."""
    for f in range(len(name_off) - 1):
        a, b = name_off[f], name_off[f + 1]
        if q1 - q0 == b - a:
            same = True
            for j in range(b - a):
                if buf[q0 + j] != names[a + j]:
                    same = False
                    break
            if same:
                return f
    return -1


@jit
def _string(buf, i, end):
    """At an opening quote: (index of the closing quote or ``end``, a backslash seen)."""
    i += 1
    escaped = False
    while i < end and buf[i] != 34:
        if buf[i] == 92:
            escaped = True
            i += 1
        i += 1
    return i, escaped


@jit
def _value(buf, i, end, ln, f, kinds, state, spans, ranges, ints, floats, counts, slow, n_slow, pow10):
    """The value of field ``f`` after its key (``buf[i]`` just past the closing quote): an array
    parsed, or ``null`` (INT and FLOAT kinds). Returns (next index, status, ints, floats, slow,
    n_slow)."""
    i = _ws(buf, i, end)
    if i >= end or buf[i] != 58:  # ':'
        return i, NOT_ARRAY, ints, floats, slow, n_slow
    i = _ws(buf, i + 1, end)
    k = kinds[f]
    if (k == INT or k == FLOAT) and i + 4 <= end and buf[i] == 110 and buf[i + 1] == 117 and buf[i + 2] == 108 \
            and buf[i + 3] == 108:
        state[ln, f] = NULL
        return i + 4, OK, ints, floats, slow, n_slow
    if i >= end or buf[i] != 91:  # '['
        return i, NOT_ARRAY, ints, floats, slow, n_slow
    b = _buffer(k)
    spans[ln, 2 * f] = i
    ranges[ln, 2 * f] = counts[b]
    i, st, wrapped, ints, floats, slow, n_slow = _array(buf, i, end, k, ints, floats, counts, slow, n_slow, pow10)
    state[ln, f] = WRAPPED if wrapped else ARRAY
    spans[ln, 2 * f + 1] = i
    ranges[ln, 2 * f + 1] = counts[b]
    return i, st, ints, floats, slow, n_slow


@jit
def scan(buf, starts, ends, names, name_off, kinds, pow10):
    """Per line ``buf[starts[l]:ends[l]]``: ``status`` (OK or the reason it is doubtful); per
    field f, ``state`` (ABSENT, ARRAY, NULL, WRAPPED), the value's byte span ``spans[l, 2f:2f+2]``
    and its values ``ranges[l, 2f:2f+2]`` in ``ints`` or ``floats`` (by ``kinds[f]``); ``slow``: (start,
    end, slot in ``floats``) of the float literals left to :func:`convert_slow`. A doubtful line
    leaves no values behind."""
    n_lines, n_fields = len(starts), len(kinds)
    status = np.zeros(n_lines, np.int64)
    state = np.zeros((n_lines, n_fields), np.int64)
    spans = np.zeros((n_lines, 2 * n_fields), np.int64)
    ranges = np.zeros((n_lines, 2 * n_fields), np.int64)
    ints = np.empty(max(16, len(buf) // 4), np.int64)
    floats = np.empty(max(16, len(buf) // 16), np.float64)
    slow = np.empty(48, np.int64)
    counts = np.zeros(2, np.int64)
    n_slow = 0
    for ln in range(n_lines):
        mark = (counts[0], counts[1], n_slow)
        st, ints, floats, slow, n_slow = _line(buf, starts[ln], ends[ln], ln, names, name_off, kinds, state,
                                               spans, ranges, ints, floats, counts, slow, n_slow, pow10)
        if st != OK:
            status[ln] = st
            state[ln, :] = ABSENT
            counts[0], counts[1], n_slow = mark
    return status, state, spans, ranges, ints[:counts[0]], floats[:counts[1]], slow[:3 * n_slow].reshape(-1, 3)


@jit
def _line(buf, i, end, ln, names, name_off, kinds, state, spans, ranges, ints, floats, counts, slow, n_slow, pow10):
    """One line: walk its structure, parse its named fields. Returns (status, buffers...)."""
    i = _ws(buf, i, end)
    if i >= end or buf[i] != 123:  # '{'
        return NOT_OBJECT, ints, floats, slow, n_slow
    depth = 0
    expect_key = False
    while i < end:
        c = buf[i]
        if c == 34:  # '"'
            q1, escaped = _string(buf, i, end)
            if q1 >= end:
                return UNCLOSED, ints, floats, slow, n_slow
            if depth == 1 and expect_key:
                expect_key = False
                if escaped:
                    return KEY_ESCAPE, ints, floats, slow, n_slow
                f = _key(buf, i + 1, q1, names, name_off)
                if f >= 0:
                    if state[ln, f] != ABSENT:
                        return REPEATED, ints, floats, slow, n_slow
                    i, st, ints, floats, slow, n_slow = _value(buf, q1 + 1, end, ln, f, kinds, state, spans, ranges,
                                                                ints, floats, counts, slow, n_slow, pow10)
                    if st != OK:
                        return st, ints, floats, slow, n_slow
                    continue
            i = q1 + 1
            continue
        if c == 123 or c == 91:  # { [
            depth += 1
            expect_key = depth == 1
        elif c == 125 or c == 93:  # } ]
            depth -= 1
            if depth <= 0:
                break  # the rest is json.loads' to judge
        elif c == 44 and depth == 1:  # ','
            expect_key = True
        i += 1
    return OK, ints, floats, slow, n_slow


@jit
def _gather(buf, slow):
    """The bytes of the slow literals, back to back, and their offsets."""
    offsets = np.zeros(len(slow) + 1, np.int64)
    for j in range(len(slow)):
        offsets[j + 1] = offsets[j] + slow[j, 1] - slow[j, 0]
    data = np.empty(offsets[-1], np.uint8)
    for j in range(len(slow)):
        data[offsets[j]:offsets[j + 1]] = buf[slow[j, 0]:slow[j, 1]]
    return offsets, data


def convert_slow(buf: np.ndarray, slow: np.ndarray, floats: np.ndarray) -> None:
    """The float literals the fast path left (``slow`` rows of :func:`scan`), converted by
    Arrow's correctly rounded string -> double cast into their slots of ``floats``."""
    if not len(slow):
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets, data = _gather(buf, slow)
    strings = pa.LargeStringArray.from_buffers(len(slow), pa.py_buffer(offsets), pa.py_buffer(data))
    floats[slow[:, 2]] = pc.cast(strings, pa.float64()).to_numpy(zero_copy_only=False)


def field_names(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets) of the field names, as :func:`scan` takes them."""
    raw = [n.encode() for n in names]
    return np.frombuffer(b"".join(raw), np.uint8), np.cumsum([0] + [len(r) for r in raw]).astype(np.int64)
