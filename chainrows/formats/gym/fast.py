"""A fast reader for staged.jsonl lines (docs/gym.md, "Speed"): the token arrays without json.loads.

Nearly all of a staged line's bytes are its three arrays (``token_ids_delta``,
``token_mask_delta``, ``generation_log_probs_delta``). A Numba kernel scans a block of lines
once: it follows the line's JSON structure (strings, nesting) to find those three keys at the
top level, checks each value is an array of JSON numbers, and parses the numbers into flat
uint64 / float64 buffers. The line with each array replaced by ``0`` then goes to ``json.loads``
(a few hundred bytes), and :func:`chainrows.formats.gym.records.parse_staged` form-checks it with the
kernel's arrays. The StagedCall's arrays are views of the flat buffers.

The exact parser (json.loads of the whole line, records.parse_staged) stays the authority: a
line the kernel cannot read exactly as json.loads would is *doubtful* and is parsed by it
instead, where it gives its value or raises its one-line error. Equivalence:

- The kernel lexes strings exactly (a quote ends a string unless escaped) and tracks nesting,
  so it sees every top-level key of a valid line. A line is doubtful unless its first non-blank
  byte is ``{``, each of the three keys occurs once, literally (a top-level key holding a
  backslash makes the line doubtful: ``"\\u0074oken_ids_delta"`` is the same key to json.loads),
  and its value is an array of numbers in JSON's grammar (``-?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?``,
  whitespace `` \\t\\n\\r``). Not JSON numbers (``NaN``, ``Infinity``, ``true``, ``null``,
  strings, nesting, ``01``, ``+1``, ``.5``) make it doubtful.
- A valid array and ``0`` are both complete JSON values after the same ``"key":`` prefix, so the
  reduced line is valid JSON exactly when the line is, and json.loads gives the same object but
  for those three values (duplicate keys elsewhere, extras, strings, encodings, the int digit
  limit: all json.loads' own). A reduced line json.loads rejects is parsed whole, exactly, and
  so is a line with a lone surrogate in a string (escaped, or as the three bytes of one), which
  json.loads decodes without complaint and the exact parser refuses.
- Ids: integer literals of at most 19 digits (every u64 below 10**19); a negative one is kept
  wrapped mod 2**64 and clears the line's ``ids_in_u64``, as records._int_array does. A
  fraction or exponent, or 20+ digits, make the line doubtful.
- Mask and logprobs: an integer literal of at most 15 digits is exactly that float (``-0`` is
  the integer 0, so +0.0, as json.loads gives int 0); longer ones make the line doubtful (the
  exact path's float conversion of huge integers differs per array). A decimal literal with a
  mantissa m <= 2**53 and a power of ten |e| <= 22 is m * 10**e or m / 10**-e in one IEEE
  operation (correctly rounded, Clinger's fast path); zero keeps its sign. Any other literal
  (17-digit reprs, large exponents) is converted by Arrow's string-to-double cast, which rounds
  correctly too (tests/test_gym.py checks it against ``float`` on random and halfway literals,
  overflow to inf and underflow to 0 included).

``FALLBACKS`` counts doubtful lines by reason (tests assert the fallbacks happen).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterable, Iterator

import numpy as np

from chainrows.engine.jit import jit
from chainrows.formats.jsonl.lines import SURROGATE, has_lone_surrogate

BLOCK_BYTES = 8 << 20  # lines handed to the kernel at a time
FIELDS = (b"token_ids_delta", b"token_mask_delta", b"generation_log_probs_delta")

# line status codes (0: read by the kernel)
OK, NOT_OBJECT, KEY_ESCAPE, MISSING, REPEATED, NOT_ARRAY, BAD_NUMBER, BIG_INT, FLOAT_ID, UNCLOSED = range(10)
REASONS = ("ok", "not an object", "escaped top-level key", "array missing", "array key repeated",
           "value is not an array", "not a JSON number", "integer too long", "non-integer id",
           "unterminated")
FALLBACKS: Counter = Counter()  # reason -> lines parsed by the exact path instead

_POW10 = np.array([10.0 ** k for k in range(23)])  # exact doubles
_TWO53 = np.uint64(1 << 53)


@jit
def _ws(buf, i, end):
    while i < end and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
        i += 1
    return i


@jit
def _grow_u(a, n):
    """``a`` with room for ``n`` values (doubled, contents kept)."""
    if n <= len(a):
        return a
    b = np.empty(max(n, 2 * len(a)), a.dtype)
    b[:len(a)] = a
    return b


@jit
def _scan(buf, starts, ends, names, name_off, pow10):
    """Per line: status, the 3 value spans (start, end) and the 3 output ranges, and whether an
    id was negative. Flat outputs: ids (uint64), mask and logprobs (float64); slow literals as
    (start, end, array, index) to be converted after."""
    n_lines = len(starts)
    status = np.zeros(n_lines, np.int64)
    spans = np.zeros((n_lines, 6), np.int64)
    ranges = np.zeros((n_lines, 6), np.int64)
    negative = np.zeros(n_lines, np.bool_)
    cap = max(16, len(buf) // 16)
    ids = np.empty(cap, np.uint64)
    mask = np.empty(cap, np.float64)
    lps = np.empty(cap, np.float64)
    counts = np.zeros(3, np.int64)  # values written per array
    slow = np.empty((max(16, cap // 64), 4), np.int64)
    n_slow = 0
    for ln in range(n_lines):
        end = ends[ln]
        i = _ws(buf, starts[ln], end)
        if i >= end or buf[i] != 123:  # '{'
            status[ln] = NOT_OBJECT
            continue
        room = counts.max() + (end - i) // 2 + 2  # a line holds at most this many values
        if room > len(ids):
            ids = _grow_u(ids, room)
            mask = _grow_u(mask, room)
            lps = _grow_u(lps, room)
        depth = 0
        expect_key = False
        seen = np.zeros(3, np.int64)
        st = OK
        mark = (counts[0], counts[1], counts[2], n_slow)
        while i < end and st == OK:
            c = buf[i]
            if c == 34:  # '"'
                q0 = i + 1
                i += 1
                escaped = False
                while i < end and buf[i] != 34:
                    if buf[i] == 92:  # backslash
                        escaped = True
                        i += 1
                    i += 1
                if i >= end:
                    st = UNCLOSED
                    break
                q1 = i
                i += 1
                if depth == 1 and expect_key:
                    expect_key = False
                    if escaped:
                        st = KEY_ESCAPE
                        break
                    k = -1
                    for f in range(3):
                        a, b = name_off[f], name_off[f + 1]
                        if q1 - q0 == b - a:
                            same = True
                            for j in range(b - a):
                                if buf[q0 + j] != names[a + j]:
                                    same = False
                                    break
                            if same:
                                k = f
                    if k < 0:
                        continue
                    seen[k] += 1
                    if seen[k] > 1:
                        st = REPEATED
                        break
                    i = _ws(buf, i, end)
                    if i >= end or buf[i] != 58:  # ':'
                        st = NOT_ARRAY
                        break
                    i = _ws(buf, i + 1, end)
                    if i >= end or buf[i] != 91:  # '['
                        st = NOT_ARRAY
                        break
                    spans[ln, 2 * k] = i
                    ranges[ln, 2 * k] = counts[k]
                    i = _ws(buf, i + 1, end)
                    if i < end and buf[i] == 93:  # ']': empty
                        i += 1
                    else:
                        while True:
                            # one JSON number
                            n0 = i
                            neg = False
                            if i < end and buf[i] == 45:
                                neg = True
                                i += 1
                            if i >= end or buf[i] < 48 or buf[i] > 57:
                                st = BAD_NUMBER
                                break
                            m = np.uint64(0)
                            sig = 0
                            frac = 0
                            if buf[i] == 48:
                                i += 1
                                if i < end and 48 <= buf[i] <= 57:
                                    st = BAD_NUMBER  # leading zero
                                    break
                            else:
                                while i < end and 48 <= buf[i] <= 57:
                                    if sig < 19:
                                        m = m * np.uint64(10) + np.uint64(buf[i] - 48)
                                    sig += 1
                                    i += 1
                            is_int = True
                            if i < end and buf[i] == 46:  # '.'
                                is_int = False
                                i += 1
                                if i >= end or buf[i] < 48 or buf[i] > 57:
                                    st = BAD_NUMBER
                                    break
                                while i < end and 48 <= buf[i] <= 57:
                                    if sig > 0 or buf[i] != 48:
                                        if sig < 19:
                                            m = m * np.uint64(10) + np.uint64(buf[i] - 48)
                                            frac += 1
                                        sig += 1
                                    else:
                                        frac += 1  # a leading zero of the fraction
                                    i += 1
                            e = 0
                            e_digits = 0
                            if i < end and (buf[i] == 101 or buf[i] == 69):  # e E
                                is_int = False
                                i += 1
                                eneg = False
                                if i < end and (buf[i] == 43 or buf[i] == 45):
                                    eneg = buf[i] == 45
                                    i += 1
                                if i >= end or buf[i] < 48 or buf[i] > 57:
                                    st = BAD_NUMBER
                                    break
                                while i < end and 48 <= buf[i] <= 57:
                                    if e_digits < 6:
                                        e = e * 10 + (buf[i] - 48)
                                    e_digits += 1
                                    i += 1
                                if eneg:
                                    e = -e
                            # the value
                            if k == 0:
                                if not is_int:
                                    st = FLOAT_ID
                                    break
                                if sig > 19:
                                    st = BIG_INT
                                    break
                                if neg and m != 0:
                                    negative[ln] = True
                                    m = ~m + np.uint64(1)
                                ids[counts[0]] = m
                                counts[0] += 1
                            else:
                                v = 0.0
                                if is_int:
                                    if sig > 15:
                                        st = BIG_INT
                                        break
                                    v = float(m)
                                    if neg:
                                        v = -v
                                    if v == 0.0:
                                        v = 0.0  # the integer -0 is 0
                                elif m == 0 and sig == 0:
                                    v = -0.0 if neg else 0.0
                                else:
                                    e10 = e - frac
                                    if sig <= 19 and e_digits < 6 and m <= _TWO53 and -22 <= e10 <= 22:
                                        v = float(m) * pow10[e10] if e10 >= 0 else float(m) / pow10[-e10]
                                        if neg:
                                            v = -v
                                    else:
                                        if n_slow >= len(slow):
                                            s2 = np.empty((2 * len(slow), 4), np.int64)
                                            s2[:n_slow] = slow[:n_slow]
                                            slow = s2
                                        slow[n_slow, 0] = n0
                                        slow[n_slow, 1] = i
                                        slow[n_slow, 2] = k
                                        slow[n_slow, 3] = counts[k]
                                        n_slow += 1
                                if k == 1:
                                    mask[counts[1]] = v
                                else:
                                    lps[counts[2]] = v
                                counts[k] += 1
                            i = _ws(buf, i, end)
                            if i < end and buf[i] == 44:  # ','
                                i = _ws(buf, i + 1, end)
                                continue
                            if i < end and buf[i] == 93:  # ']'
                                i += 1
                                break
                            st = BAD_NUMBER
                            break
                    if st != OK:
                        break
                    spans[ln, 2 * k + 1] = i
                    ranges[ln, 2 * k + 1] = counts[k]
                continue
            if c == 123 or c == 91:  # { [
                depth += 1
                expect_key = depth == 1  # only the opening brace starts the top level
            elif c == 125 or c == 93:  # } ]
                depth -= 1
                if depth <= 0:
                    break  # the rest is json.loads' to judge
            elif c == 44 and depth == 1:  # ','
                expect_key = True
            i += 1
        if st == OK:
            for f in range(3):
                if seen[f] == 0:
                    st = MISSING
        if st != OK:  # drop what the line wrote: its values are the exact path's to give
            status[ln] = st
            negative[ln] = False
            counts[0], counts[1], counts[2], n_slow = mark
    return status, spans, ranges, negative, ids, mask, lps, counts, slow[:n_slow]


_NAMES = np.frombuffer(b"".join(FIELDS), np.uint8)
_NAME_OFF = np.cumsum([0] + [len(f) for f in FIELDS]).astype(np.int64)


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


def _convert_slow(buf: np.ndarray, slow: np.ndarray, outs: tuple) -> None:
    """Literals outside the exact fast path: Arrow's correctly rounded string -> double cast."""
    if not len(slow):
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets, data = _gather(buf, slow)
    strings = pa.LargeStringArray.from_buffers(len(slow), pa.py_buffer(offsets), pa.py_buffer(data))
    values = pc.cast(strings, pa.float64()).to_numpy(zero_copy_only=False)
    for k in (1, 2):
        sel = slow[:, 2] == k
        outs[k][slow[sel, 3]] = values[sel]


class Parsed:
    """A line the kernel read: its record (arrays replaced by 0) and its three arrays."""

    __slots__ = ("rec", "tokens", "ids_in_u64", "mask", "logprobs")

    def __init__(self, rec, tokens, ids_in_u64, mask, logprobs):
        self.rec, self.tokens, self.ids_in_u64, self.mask, self.logprobs = rec, tokens, ids_in_u64, mask, logprobs


def read_block(lines: list) -> list:
    """``lines``: raw staged lines. Per line a Parsed, or None where the exact path must parse it."""
    joined = b"".join(lines)
    buf = np.frombuffer(joined, np.uint8)
    lengths = np.fromiter(map(len, lines), np.int64, len(lines))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    status, spans, ranges, negative, ids, mask, lps, counts, slow = _scan(buf, starts, ends, _NAMES, _NAME_OFF, _POW10)
    # the kernel's buffers may be up to twice their contents, and the calls keep views of them
    ids, mask, lps = (a[:n].copy() if len(a) > 1.25 * n + 4096 else a[:n]
                      for a, n in zip((ids, mask, lps), counts.tolist()))
    _convert_slow(buf, slow, (ids, mask, lps))
    out = []
    for ln, raw in enumerate(lines):
        st = status[ln]
        if st != OK:
            FALLBACKS[REASONS[st]] += 1
            out.append(None)
            continue
        s = spans[ln] - starts[ln]
        order = np.argsort(s[0::2])
        parts, at = [], 0
        for k in order:
            parts.append(raw[at:s[2 * k]])
            parts.append(b"0")
            at = s[2 * k + 1]
        parts.append(raw[at:])
        try:  # decoded as UTF-8 here: json.loads(bytes) would guess UTF-16/32 from NULs, which the
            # kernel, lexing bytes, never does; such a line falls back (as does a too deep one)
            rec = json.loads(b"".join(parts).decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict) or any(type(rec.get(f)) is not int or rec[f] != 0 for f in _KEYS):
            FALLBACKS["json.loads rejects the rest" if rec is None else "unexpected object"] += 1
            out.append(None)
            continue
        if SURROGATE.search(raw) and has_lone_surrogate(rec):  # the exact parser refuses it in one line
            FALLBACKS["a lone surrogate"] += 1
            out.append(None)
            continue
        r = ranges[ln]
        out.append(Parsed(rec, ids[r[0]:r[1]], not negative[ln], mask[r[2]:r[3]], lps[r[4]:r[5]]))
    return out


_KEYS = tuple(f.decode() for f in FIELDS)
# a line the kernel reads, with a literal outside the fast path (17 digits): both kernels run
_WARM_LINE = (b'{"token_ids_delta": [1], "token_mask_delta": [1], '
              b'"generation_log_probs_delta": [-0.12345678901234567]}\n')


def load_kernels() -> None:
    """Run both kernels once (compiling them on a cold cache), so that a measure of the
    process's memory afterwards counts them (chainrows.memory.budget)."""
    read_block([_WARM_LINE])


def blocks(source: Iterable[tuple[int, bytes]], block_bytes: int | None = None) -> Iterator[tuple[int, bytes, object]]:
    """(number, raw, Parsed or None) of every line of ``source``, in order, read a block at a
    time. An error of ``source`` itself (a truncated .gz) is raised after the lines before it
    are yielded, where the line-by-line reader would raise it."""
    limit = block_bytes or BLOCK_BYTES
    it = iter(source)
    while True:
        numbers, lines, size, failure = [], [], 0, None
        while size < limit:
            try:
                number, raw = next(it)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - re-raised below, in line order
                failure = exc
                break
            numbers.append(number)
            lines.append(raw)
            size += len(raw)
        if lines:
            yield from zip(numbers, lines, read_block(lines))
        if failure is not None:
            raise failure
        if size < limit:
            return
