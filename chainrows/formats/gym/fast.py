"""A fast reader for staged.jsonl lines (docs/gym.md, "Speed"): the token arrays without json.loads.

Nearly all of a staged line's bytes are its three arrays (``token_ids_delta``,
``token_mask_delta``, ``generation_log_probs_delta``). The JSON arrays kernel
(:func:`chainrows.formats.json_arrays.scan`, its strict kinds: ids ``U64``, mask and logprobs
``FLOAT_STRICT``) scans a block of lines once: it follows the line's JSON structure (strings,
nesting) to find those three keys at the top level, checks each value is an array of JSON
numbers, and parses the numbers into flat uint64 / float64 buffers. The line with each array
replaced by ``0`` then goes to ``json.loads`` (a few hundred bytes), and
:func:`chainrows.formats.gym.records.parse_staged` form-checks it with the kernel's arrays. The
StagedCall's arrays are views of the flat buffers.

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
  correctly too (tests/formats/gym/test_gym.py checks it against ``float`` on random and halfway literals,
  overflow to inf and underflow to 0 included).

``FALLBACKS`` counts doubtful lines by reason (tests assert the fallbacks happen).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np

from chainrows.formats import json_arrays as JA
from chainrows.formats.jsonl.lines import SURROGATE, has_lone_surrogate

BLOCK_BYTES = 8 << 20  # lines handed to the kernel at a time
FIELDS = ("token_ids_delta", "token_mask_delta", "generation_log_probs_delta")
_NAMES, _NAME_OFF = JA.field_names(FIELDS)
_KINDS = np.array([JA.U64, JA.FLOAT_STRICT, JA.FLOAT_STRICT], np.int64)
# the kernel's status -> the reason a line is doubtful (FALLBACKS' keys)
REASONS = {JA.NOT_OBJECT: "not an object", JA.KEY_ESCAPE: "escaped top-level key",
           JA.REPEATED: "array key repeated", JA.NOT_ARRAY: "value is not an array",
           JA.BAD_NUMBER: "not a JSON number", JA.BIG_INT: "integer too long", JA.NOT_INT: "non-integer id",
           JA.UNCLOSED: "unterminated"}
_MISSING = -1  # a status of ours: the kernel read the line, but one of the arrays is not there
REASONS[_MISSING] = "array missing"
FALLBACKS: Counter = Counter()  # reason -> lines parsed by the exact path instead


class Parsed:
    """A line the kernel read: its record (arrays replaced by 0) and its three arrays."""

    __slots__ = ("rec", "tokens", "ids_in_u64", "mask", "logprobs")

    def __init__(self, rec, tokens, ids_in_u64, mask, logprobs):
        self.rec, self.tokens, self.ids_in_u64, self.mask, self.logprobs = rec, tokens, ids_in_u64, mask, logprobs


def _reduced(raw: bytes, spans: np.ndarray):
    """The line's record with each array replaced by ``0``, as json.loads gives it (None where
    it rejects it, or the record is not what the kernel saw)."""
    order = np.argsort(spans[0::2])
    parts, at = [], 0
    for k in order:
        parts.append(raw[at:spans[2 * k]])
        parts.append(b"0")
        at = spans[2 * k + 1]
    parts.append(raw[at:])
    try:  # decoded as UTF-8 here: json.loads(bytes) would guess UTF-16/32 from NULs, which the
        # kernel, lexing bytes, never does; such a line falls back (as does a too deep one)
        rec = json.loads(b"".join(parts).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        FALLBACKS["json.loads rejects the rest"] += 1
        return None
    if not isinstance(rec, dict) or any(type(rec.get(f)) is not int or rec[f] != 0 for f in FIELDS):
        FALLBACKS["unexpected object"] += 1
        return None
    if SURROGATE.search(raw) and has_lone_surrogate(rec):  # the exact parser refuses it in one line
        FALLBACKS["a lone surrogate"] += 1
        return None
    return rec


def read_block(lines: list) -> list:
    """``lines``: raw staged lines. Per line a Parsed, or None where the exact path must parse it."""
    buf = np.frombuffer(b"".join(lines), np.uint8)
    lengths = np.fromiter(map(len, lines), np.int64, len(lines))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    status, state, spans, ranges, ints, floats, slow = JA.scan(buf, starts, ends, _NAMES, _NAME_OFF, _KINDS,
                                                               JA.POW10)
    JA.convert_slow(buf, slow, floats)
    # copies: the calls keep views of them, and the kernel's buffers behind them are larger
    ids, floats = ints.view(np.uint64).copy(), floats.copy()
    status = np.where((status == JA.OK) & (state == JA.ABSENT).any(axis=1), _MISSING, status)
    out = []
    for ln, raw in enumerate(lines):
        st = status[ln]
        if st != JA.OK:
            FALLBACKS[REASONS[st]] += 1
            out.append(None)
            continue
        rec = _reduced(raw, spans[ln] - starts[ln])
        if rec is None:  # counted
            out.append(None)
            continue
        r = ranges[ln]
        out.append(Parsed(rec, ids[r[0]:r[1]], bool(state[ln, 0] != JA.WRAPPED), floats[r[2]:r[3]], floats[r[4]:r[5]]))
    return out


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
