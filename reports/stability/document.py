"""A small document model rendered twice: Markdown (images linked) and one self-contained HTML
page (images embedded as base64 PNG), so the two formats never drift apart."""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass
class Para:
    text: str  # Markdown inline: **bold**, `code`, [text](#anchor)


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    classes: list[list[str]] = field(default_factory=list)  # per cell CSS class ("pass", "fail", "")


@dataclass
class Image:
    path: Path
    alt: str


Block = Heading | Para | Bullets | Table | Image


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            if b.anchor:
                out.append(f'<a id="{b.anchor}"></a>')
                out.append("")
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {i}" for i in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.alt}]({b.path.name})", ""]
    return "\n".join(out)


_INLINE = [
    (re.compile(r"\[([^\]]+)\]\((#[^)]+)\)"), r'<a href="\2">\1</a>'),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<b>\1</b>"),
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])"), r"<i>\1</i>"),
]


def _inline(s: str) -> str:
    s = html.escape(s, quote=False)
    for pat, rep in _INLINE:
        s = pat.sub(rep, s)
    s = s.replace("PASS", '<span class="pass">PASS</span>').replace("FAIL", '<span class="fail">FAIL</span>')
    return s.replace("\n", "<br>")


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1500px;
       padding: 0 16px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 3px; margin-top: 30px; }
h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 12px; }
th, td { border: 1px solid #d0d0d0; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
td.fail, span.fail { background: #b2182b !important; color: white; font-weight: bold; }
td.pass, span.pass { background: #d9f0d3 !important; color: #1b5e20; font-weight: bold; }
span.fail, span.pass { padding: 0 4px; border-radius: 3px; }
td.bias { background: #fff3c4 !important; }
code { background: #f2f2f2; padding: 0 3px; border-radius: 3px; }
img { max-width: 100%; border: 1px solid #eee; margin: 6px 0 14px; }
div.wide { overflow-x: auto; max-width: 100%; }
ul { padding-left: 22px; } li { margin: 3px 0; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{CSS}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            aid = f' id="{b.anchor}"' if b.anchor else ""
            out.append(f"<h{b.level}{aid}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            out.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            out.append('<div class="wide"><table><thead><tr>' + "".join(f"<th>{_inline(h)}</th>" for h in b.header) + "</tr></thead><tbody>")
            for i, r in enumerate(b.rows):
                cls = b.classes[i] if i < len(b.classes) else []
                cells = []
                for j, c in enumerate(r):
                    k = cls[j] if j < len(cls) and cls[j] else ""
                    cells.append(f'<td class="{k}">' if k else "<td>")
                    cells.append(_inline(c) + "</td>")
                out.append("<tr>" + "".join(cells) + "</tr>")
            out.append("</tbody></table></div>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.path.read_bytes()).decode("ascii")
            out.append(f'<img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}">')
    out.append("</body></html>")
    return "\n".join(out)


__all__ = ["Heading", "Para", "Bullets", "Table", "Image", "Block", "to_markdown", "to_html"]
