"""NeMo Gym's byte layouts (docs/gym.md, "Byte layouts"): encodings and SHA-256 values.

Token payloads are built with numpy in one conversion per call (``ids``: every id as a
big-endian u64, ``f32s``: big-endian binary32), never per token. The SHA-256 of each domain
starts from a prebuilt object holding its tag, copied per use. Values are lowercase hex.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct

import numpy as np

CHAIN_TAG = b"nemo-gym-staging-chain-v1"
PREFIX_TAG = b"nemo-gym-staging-prefix-v2"
EXTRAS_TAG = b"nemo-gym-staging-extras-v1"
CALL_TAG = b"nemo-gym-staging-call-v2"

SCHEMA_VERSIONS = (2, 3)
DIGEST_VERSION = 2
EXTRAS_DIGEST_VERSION = 1
U64_LIMIT = 1 << 64

_TAGGED = {tag: hashlib.sha256(tag) for tag in (CHAIN_TAG, PREFIX_TAG, EXTRAS_TAG, CALL_TAG)}
_U64 = struct.Struct(">Q")


def sha(tag: bytes):
    """A fresh SHA-256 object already fed with ``tag`` (a copy of a prebuilt one)."""
    return _TAGGED[tag].copy()


def u64(x: int) -> bytes:
    return _U64.pack(x)


def text(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def opt_text(s: str | None) -> bytes:
    return b"\x00" if s is None else b"\x01" + text(s)


def raw32(hex_digest: str) -> bytes:
    return bytes.fromhex(hex_digest)


def ids_body(tokens: np.ndarray) -> bytes:
    """The ids() payload without its length prefix: every id as a big-endian u64."""
    return tokens.astype(">u8", copy=False).tobytes()


def f32s(values: np.ndarray) -> bytes:
    """f32s(): u64(len) then every value as big-endian binary32."""
    return _U64.pack(len(values)) + values.astype(">f4", copy=False).tobytes()


def bytes_lp(b: bytes) -> bytes:
    return _U64.pack(len(b)) + b


# ----------------------------------------------------------------------------- typed extras

class ExtrasError(ValueError):
    """The extras hold a value the typed encoding has no form for."""


def enc(value) -> bytes:
    """The typed extras encoding (docs/gym.md, "Byte layouts"): N, B, I, F, S, L, D."""
    out = bytearray()
    _enc(value, out)
    return bytes(out)


def _enc(v, out: bytearray) -> None:
    if v is None:
        out += b"N"
    elif isinstance(v, bool):
        out += b"B\x01" if v else b"B\x00"
    elif isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise ExtrasError(f"integer {v} outside int64")
        out += b"I" + struct.pack(">q", v)
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ExtrasError("non-finite number")
        out += b"F" + struct.pack(">d", v)
    elif isinstance(v, str):
        out += b"S" + text(v)
    elif isinstance(v, list):
        out += b"L" + _U64.pack(len(v))
        for item in v:
            _enc(item, out)
    elif isinstance(v, dict):
        out += b"D" + _U64.pack(len(v))
        for key in sorted(v, key=lambda k: k.encode("utf-8")):
            out += text(key)
            _enc(v[key], out)
    else:
        raise ExtrasError(f"unsupported value of type {type(v).__name__}")


def extras_digest(extras) -> str:
    """SHA-256 of the extras domain: u8(1) || enc(extras); no extras is enc(None)."""
    h = sha(EXTRAS_TAG)
    h.update(b"\x01" + enc(extras))
    return h.hexdigest()


# ----------------------------------------------------------------------------- call values

def chain_payload(parent_chain_hash: str | None, body: bytes, n: int) -> list:
    """The chain_hash input after its tag: root 0x00 || ids(delta); child 0x01 ||
    raw32(parent chain_hash) || ids(delta)."""
    head = b"\x00" if parent_chain_hash is None else b"\x01" + raw32(parent_chain_hash)
    return [head + _U64.pack(n), body]


def f32_body(values: np.ndarray) -> bytes:
    """The f32s() payload without its length prefix: every value as big-endian binary32."""
    return values.astype(">f4", copy=False).tobytes()


def digest_payload(call, token_body, mask_body, logprob_body) -> list:
    """The staging digest input after its tag, as buffers to feed in order. ``call``: the staged
    call's scalar fields (attributes as in chainrows.formats.gym.records.StagedCall); the bodies are
    ids_body / f32_body bytes (or memoryviews of them). A null chain/cumulative hash (wire
    schema 2) is fed as 0x00. A negative length is fed wrapped, as a negative token id is (the
    exporter writes the calls it is given; the import's range check fails such a call first)."""
    n, m, k = len(token_body) // 8, len(mask_body) // 4, len(logprob_body) // 4
    head = b"".join((
        bytes((call.schema_version, call.digest_version, call.extras_digest_version)),
        text(call.rollout_id), text(call.model_call_id), opt_text(call.parent_call_id), text(call.mode),
        *(_U64.pack(v % U64_LIMIT) for v in (call.prev_len, call.delta_len, call.cum_len, call.weight_version)),
        _U64.pack(8 + 8 * n), _U64.pack(n),
    ))
    mid = _U64.pack(8 + 4 * m) + _U64.pack(m)
    lp_head = _U64.pack(8 + 4 * k) + _U64.pack(k)
    tail = raw32(call.extras_digest) + _opt_raw32(call.chain_hash) + _opt_raw32(call.cumulative_hash)
    return [head, token_body, mid, mask_body, lp_head, logprob_body, tail]


def _opt_raw32(h: str | None) -> bytes:
    return b"\x00" if h is None else b"\x01" + raw32(h)


def hash_parts(tag: bytes, parts) -> str:
    """SHA-256 hex of ``tag`` followed by each buffer of ``parts`` (large updates release the GIL)."""
    h = sha(tag)
    for p in parts:
        h.update(p)
    return h.hexdigest()


_HEX64 = re.compile(r"[0-9a-f]{64}")


def is_hex64(value) -> bool:
    """64 lowercase hex characters."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None
