"""The triage HTML page: self-contained, escaped, and readable in a real headless Chromium.

The browser tests use Debian's `chromium` driven by Playwright's Python package (the `browser`
extra; no downloaded browser). They skip, saying why, when either is missing; `.ci/run`
installs both. Screenshots go to tests/artifacts/ (not committed) for a person to look at.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest

import nsys_ledger
from nsys_ledger.report.html import render_html, write_html

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]

HOSTILE_KERNEL = ("<script>window.__pwned=1</script>\"kv\" 'q' &amp; <img src=x onerror=window.__pwned=3> "
                  "set_mla_kv_buffer_kernel")
HOSTILE_NVTX = "decode <script>window.__pwned=2</script> \"bs\" 'x' </script><!--"


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def broken_fusion(expectations):
    return nsys_ledger.check(SAMPLES / "glm5-graph-broken-fusion.sqlite", expectations)


@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory) -> Path:
    """A copy of the eager sample whose kernel and NVTX names hold markup and quotes."""
    copy = tmp_path_factory.mktemp("hostile") / "hostile.sqlite"
    shutil.copyfile(SAMPLES / "glm5-eager-healthy.sqlite", copy)
    with sqlite3.connect(copy) as con:
        renamed = con.execute("UPDATE StringIds SET value = ? WHERE value = 'set_mla_kv_buffer_kernel'",
                              (HOSTILE_KERNEL,)).rowcount
        relabelled = con.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text = 'decode bs=32'",
                                 (HOSTILE_NVTX,)).rowcount
    assert renamed == 1 and relabelled == 4
    return copy


@pytest.fixture(scope="module")
def hostile_html(hostile_trace, expectations, tmp_path_factory) -> Path:
    result = nsys_ledger.check(hostile_trace, expectations, step_nvtx="^decode")
    assert result.steps.method == "nvtx" and result.step_table.height == 4
    path = tmp_path_factory.mktemp("html") / "hostile.html"
    write_html(result, path)
    return path


def test_page_is_one_file_that_loads_nothing(broken_fusion):
    page = render_html(broken_fusion)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+\bsrc=", page)
    assert "<link" not in page and "<iframe" not in page
    assert "default-src 'none'" in page  # the Content-Security-Policy forbids any request
    assert page.count("<script>") == 2  # plotly.js once, then the page's own script
    assert len(page.encode()) < 6_000_000


def test_plotly_js_comes_once_and_only_with_a_chart(broken_fusion):
    from plotly.offline import get_plotlyjs

    plotly_head = get_plotlyjs()[:200]
    with_charts = render_html(broken_fusion)
    assert with_charts.count(plotly_head) == 1
    # no decode step: no chart on the page, so no plotly.js (4.8 MB) either
    no_steps = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", step_nvtx="no_such_range",
                                 step_method="nvtx")
    assert no_steps.step_table.height == 0
    page = render_html(no_steps)
    assert plotly_head not in page and "Plotly" not in page and 'data-charts="none"' in page
    assert page.count("<script>") == 1  # the table sorting only
    assert len(page.encode()) < 300_000 < 4_000_000 < len(with_charts.encode())


def test_names_a_finding_quotes_are_code_not_backticks(broken_fusion):
    page = render_html(broken_fusion)
    assert ("layers 3-77: + <code>per_token_group_quant</code> after <code>fused_add_rmsnorm</code> "
            "(after moe sequence entry 1 of 27)") in page
    assert "`" not in page.split('id="findings"')[1].split("</ul>")[0]


def test_count_and_step_axes_tick_whole_numbers(broken_fusion):
    from nsys_ledger.report.figures import integer_axis, three_column_ledger

    figure = three_column_ledger(broken_fusion.step_table)
    # every step launched 2,233 kernels: one tick at 2,233, none at 2,232.5
    assert (figure.layout.yaxis2.tick0, figure.layout.yaxis2.dtick, figure.layout.yaxis2.tickformat) == (2233, 1, ",d")
    assert (figure.layout.xaxis3.tick0, figure.layout.xaxis3.dtick) == (0, 1)  # steps 0-3
    assert integer_axis(range(3, 500))["dtick"] == 100 and integer_axis(range(3, 500))["tick0"] == 0


def test_failing_sample_page_leads_with_the_verdict_and_the_failing_anchor(broken_fusion):
    page = render_html(broken_fusion)
    verdict_at = page.index('id="verdict"')
    assert "FAIL: 6 finding(s) in 20 checks on 4 decode steps" in page[verdict_at:verdict_at + 200]
    assert page.index("[anchors.per_token_group_quant]") < page.index('id="ledger"')
    assert "per_token_group_quant kernels: 231 per step, expected 75 (= moe_layers)" in page
    assert "231 ×4" in page and "156 ×4" in page  # per-step distributions in the ledger table
    assert "hint: extra quantization kernels: a fusion broke" in page
    assert "the kernels of the 2 step(s) drawn here only (4,466 of 8,932 decode kernels)" in page


def test_healthy_sample_page_passes_and_names_what_it_checked(expectations):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", expectations)
    page = render_html(result)
    assert '<header class="banner pass" id="verdict"><h1>PASS: all 20 checks passed on 4 decode steps</h1>' in page
    for name in ("anchor fused_add_rmsnorm", "anchor sparse_mla", "anchor paged_mqa_logits", "total kernels per step",
                 "H2D copies per step", "graph launches per step", "gaps above 2 us"):
        assert f"<td>{name}</td>" in page
    assert ("gaps: no idle gap above 2 µs in any decode step but the 4 allowed step-entry gaps (the wait for "
            "cudaGraphLaunch, cause launch)") in page


def test_sections_without_data_say_so_in_one_line(expectations):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite")  # no ledger
    page = render_html(result)
    assert "SUMMARY: no expectations given; 4 decode steps counted" in page
    assert "ledger: no expectations given (--expect FILE checks a ledger)" in page


def test_names_from_the_trace_are_escaped_everywhere(hostile_html):
    page = hostile_html.read_text()
    assert "window.__pwned=1</script>" not in page and "window.__pwned=2</script>" not in page
    assert "<img src=x" not in page
    # shown as text in the tables and headings ...
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;&quot;kv&quot; &#x27;q&#x27; &amp;amp;" in page
    assert "NVTX &#x27;decode &lt;script&gt;window.__pwned=2&lt;/script&gt;" in page
    # ... and inside the embedded chart data (hover texts: short names, escaped for plotly, whose
    # `&` and `<` are JSON escapes there)
    assert "\\u0026quot;kv\\u0026quot; \\u0026#x27;q\\u0026#x27; \\u0026amp;amp;" in page


# ---- real headless Chromium ---------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is not installed ({CHROMIUM} missing; apt-get install chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright's Python package is missing (pip install -e '.[browser]')"
    )
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_page(browser, path: Path):
    """The page after every chart is drawn, with the console messages and page errors it logged."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    messages: list[tuple[str, str]] = []
    page.on("console", lambda m: messages.append((m.type, m.text)))
    page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))
    page.goto(path.as_uri())
    # a selector, not a JS predicate: the page's Content-Security-Policy forbids eval
    page.wait_for_selector('body[data-charts="ready"], body[data-charts="failed"]', state="attached",
                           timeout=120_000)
    return page, messages


def test_failing_sample_in_chromium_shows_verdict_anchor_and_heatmap(browser, broken_fusion, tmp_path):
    report = tmp_path / "broken-fusion.html"
    write_html(broken_fusion, report)
    page, messages = open_page(browser, report)
    assert page.evaluate("document.body.dataset.charts") == "ready"
    assert [m for m in messages if m[0] in ("error", "pageerror")] == []
    assert page.inner_text("#verdict h1") == "FAIL: 6 finding(s) in 20 checks on 4 decode steps"
    failing_row = page.locator("table.ledger tr", has_text="anchors.per_token_group_quant")
    assert failing_row.locator("td").first.inner_text() == "FAIL"
    assert "231 ×4" in failing_row.inner_text()
    assert page.locator("#heatmap .main-svg").count() >= 1
    assert page.locator("#timeline-representative .main-svg").count() >= 1
    assert page.locator("#timeline-worst .main-svg").count() >= 1
    assert page.locator("#three-column-ledger .main-svg").count() >= 1
    # axes of steps and counts tick whole numbers only
    for chart in ("three-column-ledger", "step-time", "step-budget"):
        ticks = page.locator(f"#{chart} g[class^='x'][class$='tick'] text").evaluate_all(
            "els => els.map(e => e.textContent)")
        assert ticks and all(re.fullmatch(r"[0-9]+", t) for t in ticks), (chart, ticks)
    kernel_ticks = page.locator("#three-column-ledger g.y2tick text").evaluate_all("els => els.map(e => e.textContent)")
    assert kernel_ticks == ["2,233"]
    # the heatmap's counts at a readable size: 13 px, not 9
    sizes = page.locator("#heatmap g.text-group text, #heatmap .textpoint text, #heatmap text").evaluate_all(
        "els => els.filter(e => /^[0-9]+$/.test(e.textContent)).map(e => getComputedStyle(e).fontSize)")
    assert sizes and set(sizes) == {"13px"}
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "check-broken-fusion.png"))
    page.screenshot(path=str(ARTIFACTS / "check-broken-fusion-full.png"), full_page=True)
    page.close()


def test_hostile_names_in_chromium_are_text_and_run_nothing(browser, hostile_html):
    page, messages = open_page(browser, hostile_html)
    assert page.evaluate("document.body.dataset.charts") == "ready"
    assert page.evaluate("window.__pwned === undefined")
    assert page.locator("img[src=x]").count() == 0
    text = page.inner_text("body")
    assert HOSTILE_KERNEL in text  # the kernel-names table
    assert HOSTILE_NVTX in text  # the timeline headings
    assert [m for m in messages if m[0] in ("error", "pageerror")] == []
    page.close()


def test_table_headers_sort_their_column(browser, tmp_path, expectations):
    report = tmp_path / "eager.html"
    write_html(nsys_ledger.check(SAMPLES / "glm5-eager-healthy.sqlite", expectations), report)
    page, _ = open_page(browser, report)
    gap_table = page.locator("#gaps ~ div table").first
    gap_table.locator("th", has_text="idle µs").click()
    ascending = [float(v) for v in gap_table.locator("tbody tr td:nth-child(2)").all_inner_texts()]
    gap_table.locator("th", has_text="idle µs").click()
    descending = [float(v) for v in gap_table.locator("tbody tr td:nth-child(2)").all_inner_texts()]
    assert len(ascending) == 300
    assert ascending == sorted(ascending) and descending == sorted(ascending, reverse=True)
    page.close()
