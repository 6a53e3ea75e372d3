"""Building blocks of the self-contained HTML pages (check report and trace diff).

Everything that comes from a trace (kernel names, NVTX text, paths) is untrusted: it reaches
the page only through `esc` (HTML text and attributes) or `script_json` (data inside a
<script> element, where `</script>` or `<!--` in a kernel name must not end the element).
Plotly's own text rendering understands a few HTML tags and entities, so strings meant for
chart labels and hover text are escaped with `esc` too: plotly turns `&lt;` back into a
literal `<`, and never sees a tag.

The page loads nothing: plotly.js is inlined once, a Content-Security-Policy forbids any
network access, and the charts are drawn from JSON embedded in the page.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from nsys_ledger.report.text import visible

# Characters that may end or confuse a <script> element or a JS parser, as JSON escapes
# (valid inside JSON strings, which is the only place they can occur in JSON text).
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def esc(value: object) -> str:
    """Text for HTML content or a quoted attribute; None becomes an en dash."""
    if value is None:
        return "–"
    # visible: an ESC or a bidi override in a kernel name is shown, not passed to the page
    return html.escape(visible(value), quote=True)


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def esc_code(value: object) -> str:
    """`esc`, with the names our messages quote in backticks (`deepgemm_dense`) as <code>."""
    parts = _CODE_SPAN.split(str(value))  # even indexes: prose, odd: the quoted names
    return "".join(f"<code>{esc(part)}</code>" if index % 2 else esc(part) for index, part in enumerate(parts))


def script_json(value: object) -> str:
    """JSON text that can sit inside <script type="application/json"> whatever its strings hold."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _escape_for_script(text)


def _escape_for_script(json_text: str) -> str:
    for char, escaped in _SCRIPT_UNSAFE.items():
        json_text = json_text.replace(char, escaped)
    return json_text


SCROLL_AFTER_ROWS = 20


@dataclass(frozen=True)
class Cell:
    """A table cell: shown text, the value the column sorts by, and an optional CSS class."""

    text: object
    sort: object | None = None
    css: str | None = None
    markup: str | None = None  # pre-built, already escaped markup (shown instead of `text`)


def table(headers: list[str], rows: list[list[object]], *, css: str = "", caption: str | None = None) -> str:
    """A sortable table (click a header); cells are plain values or `Cell`s, all escaped."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    caption_html = f"<caption>{esc(caption)}</caption>" if caption else ""
    markup = (
        f'<table class="sortable {esc(css)}">{caption_html}<thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )
    # Long tables scroll inside their own box, so the sections after them stay in reach.
    return f'<div class="scroll">{markup}</div>' if len(rows) > SCROLL_AFTER_ROWS else markup


def _cell(cell: object) -> str:
    if not isinstance(cell, Cell):
        cell = Cell(cell, cell if isinstance(cell, (int, float)) else None)
    attributes = ""
    if cell.sort is not None:
        attributes += f' data-sort="{esc(cell.sort)}"'
    if cell.css:
        attributes += f' class="{esc(cell.css)}"'
    content = cell.markup if cell.markup is not None else esc(cell.text)
    return f"<td{attributes}>{content}</td>"


FIGURE_MARK = "data-figure="  # every chart's embedded figure carries it (`figure`)


def figure(figure_id: str, fig: go.Figure, *, height: int | None = None) -> str:
    """A chart placeholder and its figure as embedded JSON; the page script draws it."""
    if height is not None:
        fig.update_layout(height=height)
    data = _escape_for_script(pio.to_json(fig, validate=False, pretty=False))
    return (
        f'<div class="chart" id="{esc(figure_id)}"></div>'
        f'<script type="application/json" data-figure="{esc(figure_id)}">{data}</script>'
    )


def note(text: str) -> str:
    """A one-line note where a section has no data."""
    return f'<p class="note">{esc(text)}</p>'


def page(title: str, body: str) -> str:
    """The whole document: styles, body, plotly.js once (only when the body holds a chart:
    4.8 MB of the page), scripts."""
    with_charts = FIGURE_MARK in body
    plotly_js = f"<script>{get_plotlyjs()}</script>" if with_charts else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f"<body data-charts=\"{'pending' if with_charts else 'none'}\">{body}"
        f"{plotly_js}<script>{_DRAW_CHARTS if with_charts else ''}{_SORT_TABLES}</script></body></html>\n"
    )


# No network: scripts and styles only from the page itself, images only as data/blob URLs
# (plotly's "download as PNG" button).
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:"
)

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1b1f24;background:#fff}
main{max-width:1400px;margin:0 auto;padding:0 20px 40px}
.banner{padding:18px 24px;color:#fff}
.banner h1{margin:0;font-size:30px;letter-spacing:.5px}
.banner .sub{margin-top:6px;font-size:15px;opacity:.95;word-break:break-all}
.banner.pass{background:#1a7f37}.banner.fail{background:#c62828}.banner.summary{background:#57606a}
.banner.worse{background:#c62828}.banner.same{background:#1a7f37}
.findings{margin:14px 0 0;padding:0;list-style:none}
.findings li{background:#fff0f0;border-left:5px solid #c62828;padding:8px 12px;margin:6px 0;font-size:15px}
.findings li .hint{color:#57606a;font-size:13px;margin-top:3px}
.findings li.notice{background:#fff8e1;border-left-color:#bf8700}
h2{font-size:20px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none;white-space:nowrap}
th[data-dir=asc]::after{content:" ▲"}th[data-dir=desc]::after{content:" ▼"}
td.ok{color:#1a7f37;font-weight:600}td.fail{color:#c62828;font-weight:700}
tr.failing td{background:#fff5f5}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;word-break:break-all}
caption{caption-side:bottom;text-align:left;color:#57606a;font-size:12px;padding-top:4px}
.note{color:#57606a;font-style:italic}
.chart{width:100%;min-height:200px;overflow-x:auto}
.scroll{max-height:480px;overflow:auto;border:1px solid #d0d7de}
.scroll table{margin:0}.scroll th{position:sticky;top:0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;font-size:14px}
dl.facts dt{font-weight:600}dl.facts dd{margin:0;word-break:break-all}
"""

# Draw every embedded figure, one per task, so that the browser paints the verdict and the
# tables first and stays responsive while the charts of a large trace are drawn; `data-charts`
# on <body> says when all are drawn (or that one failed).
_DRAW_CHARTS = """
(function(){
  var pending=Array.from(document.querySelectorAll('script[type="application/json"][data-figure]'));
  function done(state){document.body.setAttribute('data-charts',state);}
  function next(){
    var el=pending.shift();
    if(!el){done('ready');return;}
    try{
      var fig=JSON.parse(el.textContent);
      var div=document.getElementById(el.getAttribute('data-figure'));
      Plotly.newPlot(div,fig.data,fig.layout,{responsive:true,displaylogo:false}).then(
        function(){setTimeout(next,0);},function(err){done('failed');console.error(err);});
    }catch(err){done('failed');console.error(err);}
  }
  setTimeout(next,0);
})();
"""

# Click a header to sort by that column: numbers numerically (data-sort when given), text
# alphabetically; click again to reverse.
_SORT_TABLES = """
document.querySelectorAll('table.sortable th').forEach(function(th){
  th.addEventListener('click',function(){
    var table=th.closest('table'),body=table.tBodies[0],col=th.cellIndex;
    var asc=th.getAttribute('data-dir')!=='asc';
    table.querySelectorAll('th').forEach(function(h){h.removeAttribute('data-dir');});
    th.setAttribute('data-dir',asc?'asc':'desc');
    function key(row){var c=row.cells[col];var v=c.hasAttribute('data-sort')?c.getAttribute('data-sort'):c.textContent;
      var n=Number(v);return v!==''&&!isNaN(n)?n:v.toLowerCase();}
    Array.from(body.rows).sort(function(a,b){var x=key(a),y=key(b);
      if(typeof x!==typeof y){x=String(x);y=String(y);}
      return (x<y?-1:x>y?1:0)*(asc?1:-1);}).forEach(function(r){body.appendChild(r);});
  });
});
"""
