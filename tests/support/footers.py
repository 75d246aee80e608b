"""Crafted Parquet footers: a file's FileMetaData decoded (``chainrows.formats.native.thrift``),
changed by a test, encoded back (compact protocol) and written as a new file beside the same
data pages."""

from __future__ import annotations

import struct
from pathlib import Path

from chainrows.formats.native import thrift as t


def split(data: bytes) -> tuple[bytes, t.Struct]:
    """A Parquet file's bytes -> (everything before its footer, the decoded FileMetaData)."""
    n = int.from_bytes(data[-8:-4], "little")
    meta, _ = t.decode_struct(data[len(data) - 8 - n:len(data) - 8])
    return data[:len(data) - 8 - n], meta


def join(body: bytes, meta: t.Struct) -> bytes:
    """``body`` followed by ``meta`` encoded, its length and the magic."""
    footer = encode_struct(meta)
    return body + footer + len(footer).to_bytes(4, "little") + b"PAR1"


def craft(src: Path, dst: Path, change) -> Path:
    """``dst``: ``src`` with ``change(meta)`` applied to its decoded footer."""
    body, meta = split(src.read_bytes())
    change(meta)
    dst.write_bytes(join(body, meta))
    return dst


def chunk_meta(meta: t.Struct, group: int, column: int) -> t.Struct:
    """The ColumnMetaData of a row group's column chunk."""
    return meta[4][group][1][column][3]


def set_field(s: t.Struct, fid: int, kind: int, value) -> None:
    s[fid] = value
    s.kinds[fid] = kind


def encode_struct(s: t.Struct) -> bytes:
    out, last = bytearray(), 0
    for fid in sorted(s):
        kind = s.kinds[fid]
        if kind in (t.TRUE, t.FALSE):
            kind = t.TRUE if s[fid] else t.FALSE
        delta = fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out.append(kind)
            out += _varint(_zigzag(fid))
        last = fid
        if kind not in (t.TRUE, t.FALSE):
            out += _value(s[fid], kind)
    out.append(t.STOP)
    return bytes(out)


def _value(v, kind: int) -> bytes:
    if kind in (t.TRUE, t.FALSE):
        return bytes([t.TRUE if v else t.FALSE])
    if kind == t.BYTE:
        return bytes([v & 0xFF])
    if kind in (t.I16, t.I32, t.I64):
        return _varint(_zigzag(v))
    if kind == t.DOUBLE:
        return struct.pack("<d", v)
    if kind == t.BINARY:
        return _varint(len(v)) + bytes(v)
    if kind in (t.LIST, t.SET):
        head = bytes([len(v) << 4 | v.elem]) if len(v) < 15 else bytes([0xF0 | v.elem]) + _varint(len(v))
        return head + b"".join(_value(x, v.elem) for x in v)
    if kind == t.STRUCT:
        return encode_struct(v)
    raise ValueError(f"cannot encode compact type {kind}")


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
