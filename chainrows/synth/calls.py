"""What a simulated call is made of: its field layout (a call is a small list, mutated by the
corruptions), the Responses-API items it produces and their fingerprints (SPEC §2.1).

The canonical JSON of each item kind is written directly (fast path); ``_item_dict`` builds the
full Responses-API dict, and the tests check both agree. Texts use only the ASCII words below,
so they need no JSON escaping."""

from __future__ import annotations

import json
import random

import xxhash

_WORDS = tuple(
    """the a an of to in for on with by from at as is are was be this that it its we our you
    file line test error value result function call list table row column token model agent tool
    check fix read write run build parse return output input data path config index query search
    first next last each every some all only now then because so but and or not if when while
    looks seems need should will can must let me try again see found missing expected actual type
    python numpy arrow parquet json schema hash chain root leaf parent child length offset buffer
    reward group batch kernel loop branch retry compaction summary history context step plan done
    ok good fine wrong bug issue patch diff commit update method class module package import""".split()
)

def _phrase_pool(n: int = 4096) -> tuple[str, ...]:
    r = random.Random(20240601)
    return tuple(" ".join(r.choices(_WORDS, k=r.randint(2, 5))) for _ in range(n))


# Item texts are joined random phrases of this fixed pool (a 12-bit draw each): fast, and
# with 2+ phrases per text (and a random call_id in every function_call) equal content
# within a rollout happens only where a corruption puts it.
_PHRASES = _phrase_pool()


def _text(r: random.Random, k: int) -> str:
    bits, p = r.getrandbits, _PHRASES
    return " ".join([p[bits(12)] for _ in range(k)])


_TOOLS = (
    ("bash", "command"),
    ("read_file", "path"),
    ("search", "query"),
    ("python", "code"),
    ("edit_file", "patch"),
    ("web_fetch", "url"),
)

# Call fields (a call is a small list, mutated by corruptions).
# A simulated call is a list; these are its fields' positions (the ledger columns, in order).
CID, PARENT, RID, PREV, DELTA, GEN, HASH, KEYS, IDS, FAILED = range(10)


class Rollout:
    """One simulated rollout: its calls (capture order), token rows ``[call_id, start, stop,
    lp_start, lp_stop]`` into ``tok`` / ``lp``, rollouts rows, and its corruption kind (or None)."""

    __slots__ = ("calls", "tok_rows", "ro_rows", "tok", "lp", "kind")


def _reasoning_canonical(text: str) -> str:
    return '{"summary":[{"text":"' + text + '","type":"summary_text"}],"type":"reasoning"}'


def _message_canonical(text: str) -> str:
    return (
        '{"content":[{"annotations":[],"text":"' + text + '","type":"output_text"}],'
        '"role":"assistant","type":"message"}'
    )


def _function_call_canonical(call_id: str, name: str, arguments: str) -> str:
    return (
        '{"arguments":' + json.dumps(arguments) + ',"call_id":"' + call_id + '","name":"' + name + '",'
        '"type":"function_call"}'
    )


def _item_dict(kind: str, item_id: str | None, *fields: str) -> dict:
    """The Responses-API item the fast path fingerprints (for tests and notebooks)."""
    if kind == "reasoning":
        (text,) = fields
        return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]}
    if kind == "message":
        (text,) = fields
        return {
            "type": "message",
            "id": item_id,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    call_id, name, arguments = fields
    return {
        "type": "function_call",
        "id": item_id,
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _key(canonical: str) -> int:
    return xxhash.xxh3_64_intdigest(canonical.encode())


def hex_id(r: random.Random, n: int = 16) -> str:
    """``n`` random lowercase hex digits drawn from ``r`` (the ids of calls, responses, items)."""
    return f"{r.getrandbits(4 * n):0{n}x}"


def call_items(r: random.Random, final: bool, with_ids: float) -> tuple[list[int], list]:
    """item_keys and item_ids of one call: [reasoning?] [message?] (function_call | message)."""
    keys, ids = [], []
    rand = r.random
    if rand() < 0.75:
        keys.append(_key(_reasoning_canonical(_text(r, 2 + r.getrandbits(2)))))
        ids.append("rs_" + hex_id(r) if rand() < with_ids else None)
    if final:
        keys.append(_key(_message_canonical(_text(r, 2 + r.getrandbits(3)))))
        ids.append("msg_" + hex_id(r) if rand() < with_ids else None)
        return keys, ids
    if rand() < 0.12:
        keys.append(_key(_message_canonical(_text(r, 1 + r.getrandbits(2)))))
        ids.append("msg_" + hex_id(r) if rand() < with_ids else None)
    name, arg = _TOOLS[r.randrange(len(_TOOLS))]
    arguments = '{"' + arg + '":"' + _text(r, 1 + r.getrandbits(1)) + '"}'
    keys.append(_key(_function_call_canonical("call_" + hex_id(r, 12), name, arguments)))
    ids.append("fc_" + hex_id(r) if rand() < with_ids else None)
    return keys, ids
