"""The inspect report's HTML: one static page, inline CSS and SVG, no script, no network."""

from __future__ import annotations

import html

from chainrows.explanation.render import explanation_html

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
.bar{display:inline-block;height:10px;background:#0072B2}
.chainrows-explain{border-top:2px solid #888;margin-top:24px;padding-top:8px}
.chainrows-explain table{font-size:12px}code{background:#f3f3f3}
"""


def _table(rows: list[tuple], head: tuple | None) -> str:
    esc = html.escape
    out = ["<table>" + ("<tr>" + "".join(f"<th>{esc(str(h))}</th>" for h in head) + "</tr>" if head else "")]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{cell if isinstance(cell, _Raw) else esc(str(cell))}</td>"
                                    for cell in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


class _Raw(str):
    """Markup put in a table cell as it is."""


def _bar(share: float) -> _Raw:
    return _Raw(f'<span class="bar" style="width:{max(1, round(300 * share))}px"></span> {100 * share:.1f} %')


def provenance_section(prov: dict | None) -> str:
    if not prov:
        return "<h2>How this output was made</h2><p>The output records no provenance (written before " \
               "chainrows recorded it, or by another tool).</p>"
    rows = [("chainrows", prov.get("chainrows")), ("command", prov.get("command"))]
    rows += [(f"option {k}", ("yes" if v else "no") if isinstance(v, bool) else v)
             for k, v in sorted((prov.get("options") or {}).items())]
    rows += [(f"input {k}", v) for k, v in sorted((prov.get("input") or {}).items())]
    return '<h2>How this output was made</h2><div id="provenance">' + _table(rows, ("what", "value")) + "</div>"


def status_section(counts: list[tuple[str, int]], total: int) -> str:
    rows = [(_Raw(f"<code>{html.escape(k)}</code>"), n, _bar(n / total if total else 0)) for k, n in counts]
    return '<h2>Status and reasons</h2><div id="reasons">' + _table(rows, ("status / reason", "rollouts", "share")) + "</div>"


def numbers_section(title: str, rows: list[tuple], anchor: str) -> str:
    return f'<h2>{html.escape(title)}</h2><div id="{anchor}">' + _table(rows, None) + "</div>"


def drilldowns_section(title: str, explanations: list[dict], anchor: str, note: str) -> str:
    body = "".join(explanation_html(e) for e in explanations) or "<p>none</p>"
    return f'<h2>{html.escape(title)}</h2><p>{html.escape(note)}</p><div id="{anchor}">{body}</div>'


def page(title: str, sections: list[str]) -> str:
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>" + "".join(sections) + "</body></html>")
