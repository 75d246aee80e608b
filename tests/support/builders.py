"""Helpers to write SPEC §2 input tersely, then corrupt any field.

    b = RolloutBuilder("r1", group_id="g", reward=1.0)
    b.call("c1", None, carry=[1, 2], gen=[3], items=[message("hi", "msg_1")])
    b.call("c2", "c1", carry=[4], gen=[5, 6], items=[message("bye", "msg_2")])
    b.output(["c1", "c2"])                 # output keys/ids from those calls' items
    b.ledger_row("c2")["prev_len"] = 7     # corrupt anything afterwards
    ledger, tokens, rollouts = b.build()   # deep copies, ready for reassemble()

The builder computes every derived field itself (delta_len, gen_len, prev_len from the parent,
chain_hash seeded with the parent's, item keys from item dicts) with its own small code, so the
tests do not lean on ``chainrows.reference`` to build their input.
"""

from __future__ import annotations

import copy
import struct

import xxhash

from chainrows.formats.items import fingerprint

LAST = "last"  # output(terminal=LAST): the response_id of the last output call


def delta_hash(tokens, seed: int = 0) -> int:
    """XXH3-64 of the tokens as little-endian int32, seeded (SPEC §2)."""
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}i", *tokens), seed)


# Responses-API style model-authored items (SPEC §2.1).
def reasoning(text: str, id: str | None = None) -> dict:
    return {"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": text}]}


def message(text: str, id: str | None = None) -> dict:
    return {
        "type": "message",
        "role": "assistant",
        "id": id,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(name: str, arguments: str, call_id: str, id: str | None = None) -> dict:
    return {"type": "function_call", "id": id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


def key_of(item) -> int:
    """An item's fingerprint; a raw int is taken as the key itself."""
    return item if isinstance(item, int) else fingerprint(item)


def gen_logprobs(n: int) -> list:
    """Negative, float32-exact logprobs for n generated tokens."""
    return [-0.5 * (j + 1) for j in range(n)]


class RolloutBuilder:
    """One rollout: its ledger rows, token rows and rollouts row."""

    def __init__(self, rollout_id: str = "r", group_id: str | None = "g", reward=1.0, *,
                 logprobs: bool = False):
        self.rollout_id = rollout_id
        self.logprobs = logprobs
        self.ledger: list = []
        self.tokens: list = []
        self.record: dict = {
            "rollout_id": rollout_id,
            "group_id": group_id,
            "reward": reward,
            "output_keys": [],
            "output_ids": [],
            "terminal_response_id": None,
        }
        self.extra_records: list = []  # further rollouts rows (duplicates)
        self._calls: dict = {}

    # -- calls ---------------------------------------------------------------------------
    def call(self, call_id: str, parent_id: str | None = None, carry=(), gen=(), items=(), *,
             response_id: str | None = None, item_ids="auto", failed: bool = False,
             **overrides) -> dict:
        """Add a captured call: a ledger row and its token row. Derived fields are computed
        from the parent added earlier (a parent_id naming no added call gives prev_len 0 and
        seed 0). ``items``: item dicts (fingerprinted) or raw int keys. ``item_ids``: "auto"
        (each dict's "id", or "<call_id>.<j>" for raw ints), an explicit list, or None.
        ``overrides`` replace ledger fields after derivation."""
        carry, gen = list(carry), list(gen)
        delta = carry + gen
        parent = self._calls.get(parent_id) if parent_id is not None else None
        if item_ids == "auto":
            item_ids = [it.get("id") if isinstance(it, dict) else f"{call_id}.{j}"
                        for j, it in enumerate(items)]
        row = {
            "rollout_id": self.rollout_id,
            "call_id": call_id,
            "parent_id": parent_id,
            "response_id": response_id if response_id is not None else f"resp-{call_id}",
            "prev_len": parent["prev_len"] + parent["delta_len"] if parent else 0,
            "delta_len": len(delta),
            "gen_len": len(gen),
            "chain_hash": delta_hash(delta, parent["chain_hash"] if parent else 0),
            "item_keys": [key_of(it) for it in items],
            "item_ids": None if item_ids is None else list(item_ids),
            "failed": failed,
        }
        row.update(overrides)
        self.ledger.append(row)
        self._calls[call_id] = row
        tok = {"rollout_id": self.rollout_id, "call_id": call_id, "tokens": delta}
        if self.logprobs:
            tok["logprobs"] = [0.0] * len(carry) + gen_logprobs(len(gen))
        self.tokens.append(tok)
        return row

    def ledger_row(self, call_id: str) -> dict:
        """The (first) ledger row of a call, to corrupt in place."""
        return next(r for r in self.ledger if r["call_id"] == call_id)

    def token_row(self, call_id: str) -> dict:
        """The (first) token row of a call, to corrupt in place."""
        return next(r for r in self.tokens if r["call_id"] == call_id)

    def delta(self, call_id: str) -> list:
        return list(self.token_row(call_id)["tokens"])

    def drop_tokens(self, call_id: str) -> None:
        self.tokens = [r for r in self.tokens if r["call_id"] != call_id]

    def duplicate_tokens(self, call_id: str) -> None:
        self.tokens.append(copy.deepcopy(self.token_row(call_id)))

    def response_id(self, call_id: str) -> str:
        return self.ledger_row(call_id)["response_id"]

    # -- the rollouts row -------------------------------------------------------------------
    def output(self, call_ids, *, ids: bool = True, terminal=LAST, accepted_calls=None,
               accepted=None, extra=()) -> dict:
        """Set output_keys/output_ids to the items of these calls, in order (``extra``: more
        raw (key, id) pairs appended). ``ids=False``: output_ids null. ``terminal``: LAST, None
        or a response id. ``accepted_calls`` (call ids) or ``accepted`` (response ids) set
        accepted_response_ids."""
        keys, out_ids = [], []
        for cid in call_ids:
            row = self.ledger_row(cid)
            keys += row["item_keys"]
            out_ids += row["item_ids"] if row["item_ids"] is not None else [None] * len(row["item_keys"])
        for key, id_ in extra:
            keys.append(key)
            out_ids.append(id_)
        self.record["output_keys"] = keys
        self.record["output_ids"] = out_ids if ids else None
        if terminal == LAST:
            terminal = self.response_id(call_ids[-1]) if call_ids else None
        self.record["terminal_response_id"] = terminal
        if accepted_calls is not None:
            accepted = [self.response_id(c) for c in accepted_calls]
        if accepted is not None:
            self.record["accepted_response_ids"] = list(accepted)
        return self.record

    def null_ids(self) -> None:
        """Every served id and every output id null (null lists)."""
        for row in self.ledger:
            row["item_ids"] = None
        self.record["output_ids"] = None

    def duplicate_record(self, **changes) -> dict:
        """Append a further rollouts row for this rollout id (only the first counts)."""
        rec = copy.deepcopy(self.record)
        rec.update(changes)
        self.extra_records.append(rec)
        return rec

    def build(self):
        """(ledger, tokens, rollouts) as fresh deep copies."""
        return copy.deepcopy((self.ledger, self.tokens, [self.record] + self.extra_records))


def combine(*parts):
    """Concatenate several builders (or (ledger, tokens, rollouts) triples) into one dataset."""
    ledger, tokens, rollouts = [], [], []
    for part in parts:
        lg, tk, ro = part.build() if isinstance(part, RolloutBuilder) else copy.deepcopy(part)
        ledger += lg
        tokens += tk
        rollouts += ro
    return ledger, tokens, rollouts


# Token deltas of the worked example, spelled out so tests can state rows literally.
WX_TOKENS = {
    "c1": ([1, 2, 3], [10, 11]),   # root: the whole prompt, then the generation
    "c2": ([4], [12, 13]),         # tool result, then generation
    "c3": ([5, 6], [14]),          # compaction: a new root with the rewritten prompt
    "c4": ([8, 9], [15, 16]),      # rejected retry of c5's request
    "c5": ([8, 9], [17, 18, 19]),
}


def worked_example(rollout_id: str = "wx", group_id: str | None = "g", reward=1.0, *,
                   logprobs: bool = False, twin: bool = False, terminal=LAST) -> RolloutBuilder:
    """The SPEC §1 worked example: c1 root; c2 child of c1; c3 root; c4 child of c3 (a rejected
    retry); c5 child of c3. The output holds the items of c1, c2, c3, c5: a reasoning item and
    an assistant message each. ``twin=True``: c4's items have the same content (same keys) as
    c5's, with their own ids."""
    b = RolloutBuilder(rollout_id, group_id, reward, logprobs=logprobs)
    texts = {
        "c1": ("plan: search the docs", "Searching."),
        "c2": ("the tool found two pages", "Reading page one."),
        "c3": ("summary so far: two pages", "Checking page two."),
        "c4": ("page two is irrelevant", "Done (rejected)."),
        "c5": ("page two has the answer", "The answer is 42."),
    }
    if twin:
        texts["c4"] = texts["c5"]
    parents = {"c1": None, "c2": "c1", "c3": None, "c4": "c3", "c5": "c3"}
    for cid in ("c1", "c2", "c3", "c4", "c5"):
        carry, gen = WX_TOKENS[cid]
        think, answer = texts[cid]
        n = cid[1:]
        b.call(cid, parents[cid], carry, gen, [reasoning(think, f"rs_{n}"), message(answer, f"msg_{n}")])
    b.output(["c1", "c2", "c3", "c5"], terminal=terminal)
    return b


def single_chain(rollout_id: str = "sc", group_id: str | None = "g", reward=1.0, *,
                 logprobs: bool = False, terminal=LAST) -> RolloutBuilder:
    """Ordinary capture, one chain c1 -> c2 -> c3 (tool calls, then a final message)."""
    b = RolloutBuilder(rollout_id, group_id, reward, logprobs=logprobs)
    b.call("c1", None, [1, 2], [3, 4],
           [reasoning("look it up", "rs_1"), function_call("search", '{"q":"x"}', "fc1", "fc_1")])
    b.call("c2", "c1", [5], [6], [function_call("open", '{"page":1}', "fc2", "fc_2")])
    b.call("c3", "c2", [7, 8], [9], [message("It is x.", "msg_3")])
    b.output(["c1", "c2", "c3"], terminal=terminal)
    return b


def one_call(rollout_id: str, group_id: str | None = "g", reward=1.0, **kw) -> RolloutBuilder:
    """The smallest ok rollout: one root call with one message."""
    b = RolloutBuilder(rollout_id, group_id, reward, **kw)
    b.call("c1", None, [1, 2], [3], [message(f"answer of {rollout_id}", f"msg_{rollout_id}")])
    b.output(["c1"])
    return b


def scribble_pages(path) -> None:
    """Flip bits all over a Parquet file's data pages, its footer left intact (the schema still
    reads; decoding fails)."""
    data = bytearray(path.read_bytes())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    for i in range(4, footer_start, 7):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
