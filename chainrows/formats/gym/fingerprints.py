"""NeMo Gym output-item fingerprints (docs/gym.md, "Output-item fingerprints"): what ``output_items[*].fingerprint`` holds.

An independent reading of Gym's definition, not yet confirmed against Gym's runtime
(docs/gym.md). Item keys of the imported dataset are the first 8 bytes of a fingerprint read
as a big-endian uint64.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from typing import Any

REPLAY_TAG = b"nemo-gym-replay-v1\0"
LINEAGE_TAG = b"nemo-gym-lineage"
_REPLAY_DROPPED = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs",
                             "routed_experts", "id", "status"})
_TEXT_BLOCKS = frozenset({"", "text", "input_text", "output_text"})
_SKIPPED_BLOCKS = frozenset({"tool_use", "tool_result"})
_LINEAGE_FIELD = struct.Struct(">BQ")


def is_model_authored(item: dict) -> bool:
    """Gym's reading: ``role == "assistant"``, or type ``reasoning`` or ``function_call``."""
    return item.get("role") == "assistant" or item.get("type") in ("reasoning", "function_call")


def canonical(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept, NaN/Infinity rejected (ValueError)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _strip_replay(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_replay(v) for k, v in value.items() if k not in _REPLAY_DROPPED and v is not None}
    if isinstance(value, list):
        return [_strip_replay(v) for v in value if v is not None]
    return value


def _upd(h, tag: int, s: str) -> None:
    b = s.encode("utf-8")
    h.update(_LINEAGE_FIELD.pack(tag, len(b)))
    h.update(b)


def _content_parts(content: Any) -> Iterable[tuple[str, str]]:
    if isinstance(content, str):
        if content:
            yield "text", content
        return
    if not isinstance(content, list):
        return
    for block in content:
        if isinstance(block, str):
            yield "text", block
        elif isinstance(block, dict) and isinstance(block.get("type"), str):
            kind, txt = block["type"], block.get("text")
            if kind in _TEXT_BLOCKS and isinstance(txt, str) and txt:
                yield "text", txt
            elif kind not in _SKIPPED_BLOCKS:
                yield kind, canonical(block)


def _arguments(args: Any) -> str:
    if args is None:
        return ""
    if isinstance(args, str):
        try:
            return canonical(json.loads(args))
        except ValueError:
            return args.strip()
    return canonical(args)


def fingerprint(item: dict) -> str:
    """fp(item) as 64 lowercase hex chars. Raises ValueError (NaN, unserializable values)."""
    if item.get("type") == "reasoning":
        data = canonical(_strip_replay(item)).encode("utf-8")
        return hashlib.sha256(REPLAY_TAG + data).hexdigest()
    h = hashlib.sha256(LINEAGE_TAG)
    for kind, payload in _content_parts(item.get("content")):
        _upd(h, 0x00, kind)
        _upd(h, 0x01, payload)
    if item.get("type") == "function_call":
        call_id = item.get("call_id") or item.get("id") or ""
        name = item.get("name") or ""
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
        _upd(h, 0x02, str(call_id))
        _upd(h, 0x03, str(name))
        _upd(h, 0x04, _arguments(item.get("arguments")))
    return h.hexdigest()


def key_of(fp_hex: str) -> int:
    """The item key: the fingerprint's first 8 bytes as a big-endian uint64."""
    return int(fp_hex[:16], 16)


def model_items(items: Iterable[dict]) -> tuple[list[int], list]:
    """Keys and ids of the model-authored items of a Responses-API item list."""
    keys, ids = [], []
    for item in items:
        if isinstance(item, dict) and is_model_authored(item):
            keys.append(key_of(fingerprint(item)))
            ids.append(item.get("id"))
    return keys, ids
