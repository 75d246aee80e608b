"""A Parquet footer (Thrift compact protocol) decoded by plain Python, so that its fields can be
checked before pyarrow's metadata accessors see them: some of those throw C++ exceptions that
Python cannot catch, and the process aborts (docs/limits.md, "Damaged footers").

:func:`decode_struct` turns the bytes into :class:`Struct` (field id -> value, with each field's
compact type kept in ``kinds``) and :class:`List` (values, with their element type in ``elem``):
enough to walk FileMetaData, and for tests to re-encode a footer with one field changed. Damaged
bytes raise ValueError (never IndexError, never a C++ abort).
"""

from __future__ import annotations

import struct

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
MAX_DEPTH = 64


class Struct(dict):
    """A decoded struct: field id -> value; ``kinds``: field id -> its compact type."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[int, int] = {}


class List(list):
    """A decoded list or set; ``elem``: its elements' compact type."""

    def __init__(self, elem: int, items=()) -> None:
        super().__init__(items)
        self.elem = elem


def decode_struct(buf: bytes, pos: int = 0) -> tuple[Struct, int]:
    """The struct at ``pos`` of ``buf`` and the position after its stop byte. ValueError when
    the bytes are not a well-formed compact-protocol struct."""
    try:
        return _struct(memoryview(buf), pos, 0)
    except (IndexError, struct.error) as exc:
        raise ValueError(f"footer ends inside a field ({exc})") from exc


def _struct(buf, pos: int, depth: int) -> tuple[Struct, int]:
    if depth > MAX_DEPTH:
        raise ValueError("footer nested too deep")
    out, field = Struct(), 0
    while True:
        byte = buf[pos]
        pos += 1
        kind = byte & 0x0F
        if kind == STOP:
            return out, pos
        if byte >> 4:
            field += byte >> 4
        else:
            raw, pos = varint(buf, pos)
            field = unzigzag(raw)
        if kind in (TRUE, FALSE):
            value = kind == TRUE
        else:
            value, pos = _value(buf, pos, kind, depth)
        out[field] = value
        out.kinds[field] = kind


def _value(buf, pos: int, kind: int, depth: int):
    if kind in (TRUE, FALSE):  # a bool inside a list: one byte
        return buf[pos] == TRUE, pos + 1
    if kind == BYTE:
        return buf[pos], pos + 1
    if kind in (I16, I32, I64):
        raw, pos = varint(buf, pos)
        return unzigzag(raw), pos
    if kind == DOUBLE:
        return struct.unpack_from("<d", buf, pos)[0], pos + 8
    if kind == BINARY:
        n, pos = varint(buf, pos)
        if pos + n > len(buf):
            raise ValueError("footer ends inside a binary field")
        return bytes(buf[pos:pos + n]), pos + n
    if kind in (LIST, SET):
        head = buf[pos]
        pos += 1
        n, elem = head >> 4, head & 0x0F
        if n == 15:
            n, pos = varint(buf, pos)
        if n > len(buf) - pos and elem not in (TRUE, FALSE):  # each element takes a byte or more
            raise ValueError("list longer than the footer")
        items = List(elem)
        for _ in range(n):
            v, pos = _value(buf, pos, elem, depth + 1)
            items.append(v)
        return items, pos
    if kind == MAP:
        n, pos = varint(buf, pos)
        out = {}
        if n:
            types = buf[pos]
            pos += 1
            for _ in range(n):
                k, pos = _value(buf, pos, types >> 4, depth + 1)
                v, pos = _value(buf, pos, types & 0x0F, depth + 1)
                out[k if not isinstance(k, list) else tuple(k)] = v
        return out, pos
    if kind == STRUCT:
        return _struct(buf, pos, depth + 1)
    raise ValueError(f"unknown compact type {kind} in the footer")


def varint(buf, pos: int) -> tuple[int, int]:
    """A Thrift compact (ULEB128) varint at ``buf[pos]``: (value, the position after it).
    Raises ValueError past 10 bytes; IndexError past the buffer's end."""
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long in the footer")


def unzigzag(n: int) -> int:
    """A zigzag-encoded integer decoded (0, -1, 1, -2, ... from 0, 1, 2, 3, ...)."""
    return (n >> 1) ^ -(n & 1)
