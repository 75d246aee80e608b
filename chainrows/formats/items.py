"""Item fingerprints (SPEC §2.1): XXH3-64 of a canonical JSON form of a model-authored item."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import xxhash

DROPPED_KEYS = frozenset({"id", "status"})


_NESTED = (dict, list, tuple)
# json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) builds
# this encoder on every call; built once, it gives the same text (its encode keeps no state)
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _strip(value: Any) -> Any:
    # leaves are kept as they are without a call: most of an item's values are strings
    if isinstance(value, dict):
        return {k: _strip(v) if isinstance(v, _NESTED) else v
                for k, v in value.items() if k not in DROPPED_KEYS and v is not None}
    if isinstance(value, (list, tuple)):
        return [_strip(v) if isinstance(v, _NESTED) else v for v in value]  # nulls inside arrays stay
    return value


def canonical_json(item: Any) -> str:
    """Drop ``id``, ``status`` and null-valued keys at every level; sorted keys, compact, UTF-8."""
    return _ENCODER.encode(_strip(item))


def fingerprint(item: Any) -> int:
    """XXH3-64 of ``canonical_json(item)`` encoded as UTF-8, as an unsigned 64-bit int."""
    return xxhash.xxh3_64_intdigest(canonical_json(item).encode("utf-8"))


def is_model_authored(item: dict) -> bool:
    """Assistant-role items, and role-less reasoning / function_call items (SPEC §2.1)."""
    role = item.get("role")
    if role is not None:
        return role == "assistant"
    return item.get("type") in ("reasoning", "function_call")


def model_item_keys(items: Iterable[dict]) -> tuple[list[int], list[str | None]]:
    """Fingerprints and ids of the model-authored items of a Responses-API style item list."""
    keys, ids = [], []
    for item in items:
        if is_model_authored(item):
            keys.append(fingerprint(item))
            ids.append(item.get("id"))
    return keys, ids
