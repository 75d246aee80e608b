"""An explanation drawn: a tree in the terminal, an HTML fragment with an SVG call tree.

Both work on the explanation's plain dict (``chainrows.explanation.model.Explanation``), so the
notebook view, ``chainrows explain`` and ``chainrows inspect`` draw the same thing.
"""

from __future__ import annotations

import html

# Chain colours (colour-blind safe, Okabe–Ito); unselected calls are grey.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
GREY = "#BBBBBB"
FAIL = "#D00000"


def _children(calls: list[dict]) -> tuple[list[int], dict[int, list[int]]]:
    """(tree starts, children per position): a call whose parent is null or not in the ledger
    starts a tree; children in capture order."""
    index = {c["call_id"]: c["position"] for c in calls}
    kids: dict[int, list[int]] = {}
    starts = []
    for c in calls:
        p = index.get(c["parent_id"]) if c["parent_id"] is not None else None
        if p is None:
            starts.append(c["position"])
        else:
            kids.setdefault(p, []).append(c["position"])
    return starts, kids


def tree_lines(calls: list[dict]) -> list[tuple[int, int, str]]:
    """(position, depth, prefix) of every call, parents before children, children in capture
    order; ``prefix`` draws the branches (``├─ ``, ``└─ ``, ``│  ``). An only child stays in its
    parent's column (its parent_id says the link), so a long chain does not run off the page:
    depth grows only where a call has several children. Calls only reachable through a parent
    cycle come last at depth 0."""
    starts, kids = _children(calls)
    out, seen = [], set()
    for s in starts:
        stack = [(s, 0, "", "")]
        while stack:
            c, depth, prefix, branch = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            out.append((c, depth, prefix + branch))
            children = kids.get(c, [])
            column = prefix + {"├─ ": "│  ", "└─ ": "   "}.get(branch, "")
            if len(children) == 1:
                stack.append((children[0], depth, column, ""))
                continue
            for i in reversed(range(len(children))):
                stack.append((children[i], depth + 1, column, "└─ " if i == len(children) - 1 else "├─ "))
    out.extend((c["position"], 0, "") for c in calls if c["position"] not in seen)
    return out


def tree_order(calls: list[dict]) -> list[tuple[int, int]]:
    """(position, depth) of every call in :func:`tree_lines` order."""
    return [(pos, depth) for pos, depth, _ in tree_lines(calls)]


def _call_line(c: dict, failing: str | None) -> str:
    mark = "+" if c["selected"] else "-"
    parts = [f"{mark} #{c['position']} {c['call_id']}", "root" if c["root"] else f"parent {c['parent_id']}"
             + (" (not in the ledger)" if c.get("parent_missing") else ""),
             f"delta {c['delta_len']} gen {c['gen_len']}", f"items {c['items']}"]
    if c["output_positions"]:
        ps = c["output_positions"]
        parts.append(f"output {ps[0]}" if len(ps) == 1 else f"output {ps[0]}-{ps[-1]}")
    if c["chain"] is not None:
        parts.append("chain " + ",".join(map(str, c["chains"])))
    if c["loss_tokens"]:
        parts.append(f"loss {c['loss_tokens']}")
    if c["failed"]:
        parts.append("FAILED")
    if c["call_id"] == failing:
        parts.append("<- the failing check")
    if c["why_not"]:
        parts.append(f"not trained: {c['why_not']}")
    return "  ".join(parts)


def _num(x) -> str:
    return "null" if x is None else f"{x:.6g}"


def explanation_text(e: dict) -> str:
    """The terminal view: a header, the call tree, chains, rows and the failed check."""
    fc = e.get("failed_check")
    head = f"rollout {e['rollout_id']}  {e['status']}" + (f"  {e['reason']}" if e["reason"] else "")
    lines = [head]
    if e["detail"]:
        lines.append(f"  detail: {e['detail']}")
    lines.append(f"  mode {e['mode']}, plan {e['plan']}; {e['num_calls']} calls, {e['num_selected']} "
                 f"selected, {e['num_roots']} roots; reward {_num(e['reward'])}, advantage {_num(e['advantage'])}")
    lines.append("calls (tree; + selected, - not; capture order among siblings):")
    if not e["calls"]:
        lines.append("  (no calls: the rollout has no ledger rows)")
    for pos, _, prefix in tree_lines(e["calls"]):
        lines.append("  " + prefix + _call_line(e["calls"][pos], fc and fc["call_id"]))
    for k, chain in enumerate(e["chains"]):
        lines.append(f"chain {k}: " + " -> ".join(chain))
    for row in e["rows"]:
        lines.append(f"row {row['row_id']}: {row['num_tokens']} tokens, {row['loss_tokens']} trained, "
                     f"prompt {row['prompt_len']}; calls " + ", ".join(row["call_ids"]))
    if fc:
        where = f" at call {fc['call_id']}" if fc["call_id"] else \
            f" at output position {fc['position']}" if fc["position"] is not None else ""
        lines.append(f"failed check: {fc['check']}{where}")
        if fc["expected"] is not None:
            lines += [f"  expected: {fc['expected']}", f"  found:    {fc['found']}"]
        if fc["fix"]:
            lines.append(f"  fix: {fc['fix']}")
    return "\n".join(lines)


def call_tree_svg(e: dict, row_height: int = 22, indent: int = 22) -> str:
    """An SVG drawing of the call tree: one ``<g class="call">`` per call (data-call-id,
    data-selected, data-chain), parent links as lines, chains in colour, unselected calls
    grey, the failing call outlined red. Rows follow the tree order, one call per row."""
    calls = e["calls"]
    fc = e.get("failed_check") or {}
    order = tree_order(calls)
    y_of = {pos: 14 + i * row_height for i, (pos, _) in enumerate(order)}
    x_of = {pos: 12 + d * indent for pos, d in order}
    index = {c["call_id"]: c["position"] for c in calls}
    width = max([x_of[p] + 7 * len(_svg_label(calls[p], fc.get("call_id"))) for p in x_of] + [0]) + 40
    height = 14 + len(order) * row_height
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="call-tree" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">']
    for c in calls:
        p = index.get(c["parent_id"]) if c["parent_id"] is not None else None
        if p is not None:
            a, b = c["position"], p
            out.append(f'<path d="M{x_of[b]},{y_of[b]} V{y_of[a]} H{x_of[a]}" stroke="#888" fill="none"/>')
    for pos, _ in order:
        out.append(_svg_node(calls[pos], x_of[pos], y_of[pos], fc.get("call_id")))
    out.append("</svg>")
    return "".join(out)


def _svg_label(c: dict, failing: str | None) -> str:
    tags = [] if c["selected"] else ["not selected"]
    if c["chain"] is not None:
        tags.append("chain " + ",".join(map(str, c["chains"])))
    if c["call_id"] == failing:
        tags.append("failed check")
    return c["call_id"] + (f"  ({', '.join(tags)})" if tags else "")


def _svg_node(c: dict, x: int, y: int, failing: str | None) -> str:
    if c["chain"] is not None:
        colour = PALETTE[c["chain"] % len(PALETTE)]
    else:  # selected but never cut into a chain (masked after selection): white; not selected: grey
        colour = "#FFFFFF" if c["selected"] else GREY
    stroke = f'stroke="{FAIL}" stroke-width="3"' if c["call_id"] == failing else 'stroke="#333"'
    shape = (f'<rect x="{x - 6}" y="{y - 6}" width="12" height="12" fill="{colour}" {stroke}/>' if c["root"]
             else f'<circle cx="{x}" cy="{y}" r="6" fill="{colour}" {stroke}/>')
    label = _svg_label(c, failing)
    chain = "" if c["chain"] is None else str(c["chain"])
    return (f'<g class="call" data-call-id="{html.escape(c["call_id"])}" data-selected="{int(c["selected"])}" '
            f'data-chain="{chain}"><title>{html.escape(_call_line(c, failing))}</title>{shape}'
            f'<text x="{x + 12}" y="{y + 4}">{html.escape(label)}</text></g>')


def explanation_html(e: dict) -> str:
    """A self-contained HTML fragment: header, failed check, SVG tree, calls table."""
    esc = html.escape
    fc = e.get("failed_check")
    parts = [f'<div class="chainrows-explain" data-rollout-id="{esc(e["rollout_id"])}">',
             f"<h3>rollout <code>{esc(e['rollout_id'])}</code>: {esc(e['status'])}"
             + (f" (<code>{esc(e['reason'])}</code>)" if e["reason"] else "") + "</h3>"]
    if e["detail"]:
        parts.append(f"<p>{esc(e['detail'])}</p>")
    rows = "; ".join(f"{r['row_id']} ({r['num_tokens']} tokens, {r['loss_tokens']} trained)" for r in e["rows"])
    parts.append(f"<p>mode {esc(e['mode'])}, plan {esc(e['plan'])}: {e['num_calls']} calls, {e['num_selected']} "
                 f"selected, {e['num_roots']} roots; reward {_num(e['reward'])}, advantage {_num(e['advantage'])}"
                 + (f"<br>rows: {esc(rows)}" if rows else "") + "</p>")
    if fc and fc["expected"] is not None:
        parts.append(f"<p>expected: {esc(str(fc['expected']))}<br>found: {esc(str(fc['found']))}</p>")
    if fc and fc["fix"]:
        parts.append(f"<p><b>Fix.</b> {esc(fc['fix'])}</p>")
    parts.append(call_tree_svg(e))
    cols = ("position", "call_id", "parent_id", "delta_len", "gen_len", "items", "selected", "chain",
            "loss_tokens", "why_not")
    parts.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>")
    for c in e["calls"]:
        parts.append("<tr>" + "".join(f"<td>{esc('' if c[k] is None else str(c[k]))}</td>" for k in cols) + "</tr>")
    parts.append("</table></div>")
    return "".join(parts)
