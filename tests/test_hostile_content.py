"""Hostile trace content: names that try to break the output, and odd but legal tables.

Kernel and NVTX names with quotes, `<`, `>`, newlines, terminal escapes, 100 kB of text and
bytes that are not UTF-8; 100,000 distinct kernel names; NVTX ranges never closed or closed on
another thread; correlation ids that every process reuses. The counts must stay right and
every output format must carry the text escaped: one terminal line per line of the report,
valid JSON that gives the text back, HTML and Markdown that never let a name become markup,
JUnit XML that parses.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner

from nsys_ledger import check
from nsys_ledger.cli import main
from nsys_ledger.report.html import write_html
from nsys_ledger.report.json_report import write_json
from nsys_ledger.report.junit import write_junit
from nsys_ledger.report.markdown import render_markdown
from nsys_ledger.report.terminal import render

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

SCRIPT = "<script>alert(1)</script>"
# Control characters first: the terminal's short kernel name stops at the first "(".
HOSTILE = ('\n\x1b[31mred\r\x07 "double" \'single\' `tick` \\back | * _ # [x] \u202eRTL <b>bold</b> & '
           + SCRIPT)
LONG = "L" * 100_000
UPDATE_NAME = "UPDATE StringIds SET value = ? WHERE value LIKE ?"
GTID = (1 << 48) | (2841 << 24) | 2841  # the healthy sample's scheduler thread


def _copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def _nvtx_row(start: int, end: int | None, event_type: int, text: str | bytes, gtid: int,
              end_gtid: int | None = None) -> tuple:
    return (start, end, event_type, text, gtid, end_gtid)


def _insert_nvtx(con: sqlite3.Connection, rows: list[tuple]) -> None:
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, endGlobalTid) "
                    "VALUES (?, ?, ?, CAST(? AS TEXT), ?, ?)", rows)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """The healthy 4-step graph sample, its file name and names made hostile; counts unchanged:
    every renamed kernel still matches its op's pattern."""
    folder = tmp_path_factory.mktemp("hostile")
    path = _copy(SAMPLES / "glm5-graph-healthy.sqlite", folder / f'trace {HOSTILE[:24]}.sqlite'.replace("/", "_"))
    con = sqlite3.connect(path)
    rms = "void flashinfer::norm::FusedAddRMSNormKernel"
    assert con.execute(UPDATE_NAME, (f"{rms}{HOSTILE}<(unsigned int)8, __nv_bfloat16>(T2 *, T2 *)",
                                     f"{rms}<%")).rowcount == 1
    mla = "void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel"
    assert con.execute(UPDATE_NAME, (f"{mla}{LONG}<cutlass::bfloat16_t>(flash::DecodingParams)",
                                     f"{mla}<%")).rowcount == 1
    logits = "void deep_gemm::sm90_fp8_paged_mqa_logits"
    assert con.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE value LIKE ?",
                       (logits.encode() + b"\xff\xfe\xc3<(unsigned int)1>(unsigned int)", f"{logits}<%")).rowcount == 1
    # NVTX: hostile layer-marker texts (one of them not UTF-8), plus a range never closed and a
    # start/end range that ends on another thread, both spanning the decode steps
    first = con.execute("SELECT min(rowid) FROM NVTX_EVENTS").fetchone()[0]
    con.execute("UPDATE NVTX_EVENTS SET text = ? WHERE rowid = ?", (HOSTILE + LONG, first))
    con.execute("UPDATE NVTX_EVENTS SET text = CAST(? AS TEXT) WHERE rowid = ?", (b"layer \xff\xfe", first + 1))
    t0, t1 = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    _insert_nvtx(con, [_nvtx_row(t0, None, 59, "never closed " + HOSTILE, GTID),
                       _nvtx_row(t0 + 10, t1, 60, b"ends elsewhere \xff", GTID, GTID + 7)])
    con.commit()
    con.close()
    return path


@pytest.fixture(scope="module")
def checked(hostile):
    return check(hostile, GLM)


def test_counts_survive_hostile_names(checked):
    result = checked
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert result.step_table["kernels"].to_list() == [2077] * 4
    assert result.op_table.select("fused_add_rmsnorm", "sparse_mla", "paged_mqa_logits").rows() == [
        (156, 78, 21)] * 4
    # the invalid bytes are replaced, and said so once per table that held them
    assert result.notices == ("invalid UTF-8 in StringIds replaced with U+FFFD",
                              "invalid UTF-8 in NVTX_EVENTS replaced with U+FFFD")
    names = result.trace.kernels["name"].unique()
    assert names.str.contains(SCRIPT, literal=True).sum() == 1
    assert names.str.len_chars().max() > 100_000
    assert names.str.contains("paged_mqa_logits\ufffd\ufffd\ufffd<", literal=True).sum() == 1


def test_unclosed_and_cross_thread_nvtx_ranges_are_kept_as_they_are(checked):
    nvtx = checked.trace.nvtx
    never_closed = nvtx.filter(pl.col("name").str.starts_with("never closed"))
    assert never_closed.select("end", "event_type").rows() == [(None, 59)]
    elsewhere = nvtx.filter(pl.col("name").str.starts_with("ends elsewhere"))
    assert elsewhere.select("event_type", "tid", "end_global_tid").rows() == [(60, 2841, GTID + 7)]
    assert elsewhere["name"].to_list() == ["ends elsewhere \ufffd"]


def _assert_no_raw_controls(text: str) -> None:
    """Nothing from a name may move the cursor, ring, recolour or reverse the terminal."""
    for char in ("\r", "\x07", "\x1b[31mred", "\u202e"):  # our own styling may use ESC
        assert char not in text, repr(char)


def test_terminal_keeps_one_line_per_line(hostile):
    # summary: lists kernel names; wide enough that no line wraps, so a split line is the name's doing
    result = CliRunner().invoke(main, ["check", str(hostile)], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    _assert_no_raw_controls(result.output)
    lines = result.output.splitlines()
    most_launched = result.output.split("most launched kernels per step:")[1].split("\n\n")[0].splitlines()
    rms = [line for line in most_launched if "FusedAddRMSNormKernel" in line]
    assert len(rms) == 1 and "     156  " in rms[0]
    assert "FusedAddRMSNormKernel\\n\\x1b[31mred\\r\\x07" in rms[0]
    assert lines[0].startswith("SUMMARY no expectations given")  # the verdict first
    assert lines[2] == f"nsys-ledger check {str(hostile)}".replace("\n", "\\n").replace("\x1b", "\\x1b").replace(
        "\r", "\\r").replace("\x07", "\\x07")
    assert max(len(line) for line in lines) < 300  # the 100 kB name is shortened


def test_terminal_with_expectations_passes(checked):
    text = render(checked)
    _assert_no_raw_controls(text)
    assert f"PASS all {len(checked.outcomes)} checks passed on 4 decode steps" in click.unstyle(text)


def test_json_gives_the_text_back(checked, tmp_path):
    out = tmp_path / "r.json"
    write_json(checked, out)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["trace"]["path"] == checked.trace.path
    assert HOSTILE[:24] in doc["trace"]["path"]
    assert doc["notices"] == list(checked.notices)
    assert [s["kernels"] for s in doc["steps"]] == [2077] * 4
    assert doc["verdict"] == "pass"


def test_html_escapes_every_name(checked, tmp_path):
    out = tmp_path / "r.html"
    write_html(checked, out)
    page = out.read_text(encoding="utf-8")
    assert SCRIPT not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>bold</b>" not in page
    assert "\x1b" not in page


def test_junit_parses_and_holds_every_check(checked, tmp_path):
    out = tmp_path / "r.xml"
    write_junit(checked, out)
    root = ET.parse(out).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == len(checked.outcomes) >= 10
    assert root.find(".//failure") is None
    name = root.find("testsuite").get("name")
    assert "\x1b" not in name and "\\x1b[31mred" in name  # XML 1.0 cannot hold ESC: escaped


def test_markdown_lets_no_name_become_markup(checked):
    text = render_markdown(checked)
    assert SCRIPT not in text and "<b>" not in text
    assert "\x1b" not in text and "\r" not in text
    assert all(line.count("|") % 2 == 0 or not line.startswith("|") for line in text.splitlines())


# ---- 100,000 distinct kernel names ---------------------------------------------------------------


@pytest.fixture(scope="module")
def many_names(tmp_path_factory) -> Path:
    """The healthy sample plus a second process that ran 100,000 kernels, each with its own name
    (a JIT-compiled workload: every kernel a new specialization), after the decode steps."""
    path = _copy(SAMPLES / "glm5-graph-healthy.sqlite", tmp_path_factory.mktemp("many") / "many.sqlite")
    con = sqlite3.connect(path)
    first_id = con.execute("SELECT max(id) + 1 FROM StringIds").fetchone()[0]
    end = con.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    count = 100_000
    con.executemany("INSERT INTO StringIds VALUES (?, ?)",
                    ((first_id + i, f"void jit::kernel_{i}<{i % 7}>(float *)") for i in range(count)))
    gpid = (1 << 48) | (4242 << 24)
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
        "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
        "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, "
        "tensorSizeMinusOneElements) VALUES (?, ?, 0, 9, 7, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, ?, '[]')",
        ((end + 1000 + 3000 * i, end + 3000 + 3000 * i, i + 1, gpid, first_id + i, first_id + i, 10 ** 6 + i)
         for i in range(count)))
    con.commit()
    con.close()
    return path


def test_100k_distinct_kernel_names(many_names, tmp_path):
    result = check(many_names, GLM)
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert result.totals.kernels == 12_383 + 100_000
    assert result.trace.kernels["name"].n_unique() == 100_000 + 41
    assert result.step_table["kernels"].to_list() == [2077] * 4
    summary = CliRunner().invoke(main, ["check", str(many_names)])
    assert summary.exit_code == 0
    top = summary.output.split("most launched kernels per step:")[1].strip().split("\n\n")[0].splitlines()
    assert len(top) == 10  # ten kernels, then a blank line (the step time budget follows)
    out = tmp_path / "r.html"
    write_html(result, out)
    assert "jit::kernel_" not in out.read_text(encoding="utf-8")  # not in a decode step


# ---- correlation ids reused by every process ----------------------------------------------------


def test_correlation_ids_reused_across_processes_stay_apart():
    """Each rank numbers its calls from 1, so every correlationId exists once per process; a
    kernel must only ever meet the launch call of its own process."""
    path = SAMPLES / "glm5-graph-2ranks-slow-rank1.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    shared_ids = con.execute(
        "SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        "GROUP BY correlationId HAVING count(DISTINCT globalTid >> 24) = 2)").fetchone()[0]
    con.close()
    assert shared_ids > 5000
    result = check(path, GLM)
    # the one finding is the slow rank the sample was made with
    assert [f.source for f in result.findings] == ["ranks.max_imbalance_pct"]
    table = result.step_table.sort("rank", "step")
    assert table["kernels"].to_list() == [2077] * 6
    assert table["graph_launches"].to_list() == [1] * 6
    kernels = result.steps.activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
    assert kernels.height == 6 * 2077  # no kernel met two launch calls (it would be counted twice)
    # every decode kernel found a launch call that came before it: its graph launch or the
    # sampling launch of its own step, never a call of the other process
    assert kernels["api_kind"].null_count() == 0
    assert kernels.filter(pl.col("api_start") > pl.col("start")).height == 0
    launches = kernels.group_by("rank", "step").agg(pl.col("api_start").n_unique().alias("calls"))
    assert launches["calls"].to_list() == [2] * 6


# ---- NVTX step ranges never closed, or closed on another thread ----------------------------------


def test_step_ranges_never_closed_or_closed_elsewhere_are_not_steps(tmp_path):
    """Eager sample, steps by the `decode` NVTX range: a `decode` range still open when the
    capture stopped (end NULL) and a start/end `decode` range that ended on another thread
    (nsys's own projection skips those) must not become steps, nor break the four real ones."""
    path = _copy(SAMPLES / "glm5-eager-healthy.sqlite", tmp_path / "nvtx.sqlite")
    con = sqlite3.connect(path)
    gtid, last = con.execute("SELECT globalTid, max(start) FROM NVTX_EVENTS WHERE text LIKE 'decode%'").fetchone()
    end = con.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    _insert_nvtx(con, [_nvtx_row(end - 5_000, None, 59, "decode bs=32", gtid),
                       _nvtx_row(last + 100, end, 60, "decode bs=32", gtid, gtid + 3)])
    con.commit()
    con.close()
    result = check(path, GLM, step_nvtx=r"^decode")
    assert result.steps.method == "nvtx"
    assert result.step_table.select("step", "kernels").rows() == [(0, 2077), (1, 2077), (2, 2077), (3, 2077)]
    assert result.trace.nvtx.filter(pl.col("name") == "decode bs=32").height == 4 + 2


def test_json_text_is_what_json_dumps_indent_2_writes(checked, tmp_path):
    """write_json lays out the compact C-encoded text instead of encoding with indent in Python:
    the file must be byte for byte what `json.dumps(indent=2, ensure_ascii=False)` gives."""
    from nsys_ledger.report.json_report import dumps_indented, result_document

    document = result_document(checked)
    assert dumps_indented(document) == json.dumps(document, indent=2, ensure_ascii=False)
    odd = {"empty": [[], {}], "floats": [1e-07, 1e16, -0.0, 2.5], "big": 2**70, "nan": float("nan"),
           "text": "\u00e9\"\\\n\t\u2028\x01\x7f\ufffd", "nested": {"a": {"b": []}}}
    assert dumps_indented(odd) == json.dumps(odd, indent=2, ensure_ascii=False)
    del odd["nan"]
    assert dumps_indented(odd) == json.dumps(odd, indent=2, ensure_ascii=False)
