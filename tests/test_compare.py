"""`compare(a, b)` and `nsys-ledger compare A B`: two traces lined up by step kind, role and layer.

Every expected figure comes from outside the code under test: the samples' manifest (what the
generator put in each step), plain SQL over the exports, or the Kineto JSON read with the
standard library (times as exact decimals).
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import statistics
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from nsys_ledger.api import check
from nsys_ledger.cli import main
from nsys_ledger.compare import NO_ROLE, STEP_FIGURES, compare
from nsys_ledger.report.compare_html import render_compare_html
from nsys_ledger.report.compare_json import compare_document
from nsys_ledger.report.compare_markdown import render_compare_markdown
from nsys_ledger.report.compare_text import render_compare

from shared_data import KINETO_TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
DSV32 = ROOT / "expectations" / "deepseek-v3.2-tp8-ep8.toml"
HEALTHY = SAMPLES / "glm5-graph-healthy.sqlite"
BROKEN = SAMPLES / "glm5-graph-broken-fusion.sqlite"
HEALTHY_KINETO = SAMPLES / "glm5-graph-healthy.trace.json.gz"
DSV32_HEALTHY = SAMPLES / "dsv32-graph-healthy.sqlite"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
QUANT_KERNEL = "per_token_group_quant_8bit_kernel"

SGLANG_DECODE = KINETO_TRACES / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
VLLM_DECODE = KINETO_TRACES / "AMD-AGI__TraceLens__inference_vllm_decode_full_graph_execution.json.gz"


@lru_cache(maxsize=None)
def checked(path: Path, ledger: Path | None):
    return check(path, ledger)


@lru_cache(maxsize=None)
def compared(a: Path, ledger_a: Path | None, b: Path, ledger_b: Path | None):
    return compare(checked(a, ledger_a), checked(b, ledger_b))


def steady_steps(name: str) -> list[dict]:
    """The manifest's steps without the first (4 steps per sample: the warm-up one dropped)."""
    steps = MANIFEST[name]["steps"]
    assert len(steps) == 4
    return steps[1:]


def sql(path: Path, query: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(query, args).fetchall()


# ---- GLM-5.3 healthy vs broken fusion (one ledger for both) -----------------------------------

def test_broken_fusion_is_156_more_ffn_quant_kernels_and_nothing_else():
    # the generator's own per-step kernel counts: one kernel name differs, by 156 per step
    healthy = MANIFEST[HEALTHY.name]["step_kernel_counts"]
    broken = MANIFEST[BROKEN.name]["step_kernel_counts"]
    changed = {name: broken.get(name, 0) - healthy.get(name, 0) for name in set(healthy) | set(broken)
               if broken.get(name, 0) != healthy.get(name, 0)}
    assert len(changed) == 1 and QUANT_KERNEL in next(iter(changed)) and next(iter(changed.values())) == 156

    comparison = compared(HEALTHY, GLM, BROKEN, GLM)
    assert comparison.kinds == ("decode",) and comparison.ranks == (0,)
    rows = {row.role: row for row in comparison.role_rows("decode")}
    assert (rows["ffn_quant"].kernels_a, rows["ffn_quant"].kernels_b, rows["ffn_quant"].delta) == (75, 231, 156)
    assert {role: row.delta for role, row in rows.items() if row.delta} == {"ffn_quant": 156}
    assert rows["residual_norm"].kernels_a == rows["residual_norm"].kernels_b == 156
    assert rows["moe_gemm"].kernels_a == 150 and NO_ROLE not in rows  # every kernel has a role in this ledger
    assert comparison.explaining_roles("decode")[0].role == "ffn_quant"
    assert comparison.figure("kernels") == (2077, 2233, 156)


def test_role_time_is_the_median_of_plain_sql_sums_over_the_steady_steps():
    comparison = compared(HEALTHY, GLM, BROKEN, GLM)
    row = {r.role: r for r in comparison.role_rows("decode")}["ffn_quant"]
    medians = []
    for path in (HEALTHY, BROKEN):
        per_step = []
        for step in steady_steps(path.name):
            ids = ",".join(str(i) for i in step["graph_launch_correlation_ids"])
            [(kernels, ns)] = sql(path, "SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                        f"JOIN StringIds s ON s.id = k.demangledName WHERE k.correlationId IN ({ids}) "
                                        "AND s.value LIKE ?", f"%{QUANT_KERNEL}%")
            assert kernels == (75 if path == HEALTHY else 231)
            per_step.append(ns)
        medians.append(statistics.median(per_step))
    assert (row.ns_a, row.ns_b, row.ns_delta) == (medians[0], medians[1], medians[1] - medians[0])


def test_swapping_a_and_b_negates_every_delta():
    forward = compared(HEALTHY, GLM, BROKEN, GLM)
    backward = compared(BROKEN, GLM, HEALTHY, GLM)
    for frame, key in ((forward.roles, "role"), (forward.layers, "layer")):
        other = (backward.roles if key == "role" else backward.layers).sort(key)
        mine = frame.sort(key)
        assert mine[key].to_list() == other[key].to_list()
        for column in ("delta", "ns_delta"):
            assert mine[column].to_list() == [-x for x in other[column].to_list()]
        assert mine["kernels_a"].to_list() == other["kernels_b"].to_list()
    negated = [None if x is None else -x for x in backward.figures["delta"].to_list()]
    assert forward.figures["delta"].to_list() == negated
    assert sum(abs(x) for x in forward.roles["delta"].to_list()) == 156  # the test is not of zeros only


# ---- one capture, two formats ---------------------------------------------------------------

def test_nsys_and_kineto_twins_have_no_kernel_delta_in_any_role():
    comparison = compared(HEALTHY, GLM, HEALTHY_KINETO, GLM)
    rows = comparison.role_rows("decode")
    assert len(rows) == 29 and all(row.delta == 0 for row in rows)
    assert sum(row.kernels_a for row in rows) == MANIFEST[HEALTHY.name]["kernels_per_step"] == 2077
    assert comparison.figure("kernels") == (2077, 2077, 0)
    assert comparison.figure("graph_replays") == (1, 1, 0)


# ---- two models: 78 and 61 layers -----------------------------------------------------------

def test_glm_vs_deepseek_lines_up_78_and_61_layers():
    comparison = compared(HEALTHY, GLM, DSV32_HEALTHY, DSV32)
    layers = comparison.layer_rows("decode")
    glm_layers = MANIFEST[HEALTHY.name]["step_layer_kernels"]
    dsv_layers = MANIFEST[DSV32_HEALTHY.name]["step_layer_kernels"]
    assert (len(glm_layers), len(dsv_layers)) == (78, 61)
    assert layers["layer"].to_list() == list(range(78))
    assert layers["kernels_a"].to_list() == glm_layers
    assert layers["kernels_b"].to_list() == dsv_layers + [None] * 17
    assert layers["delta"].to_list() == [b - a for a, b in zip(glm_layers, dsv_layers)] + [None] * 17
    # per role: the same vocabulary in both ledgers; the model's shape shows in the deltas
    rows = {row.role: row for row in comparison.role_rows("decode")}
    assert (rows["attention"].kernels_a, rows["attention"].kernels_b) == (78, 61)
    assert (rows["indexer_logits"].kernels_a, rows["indexer_logits"].kernels_b) == (21, 61)
    assert comparison.figure("kernels") == (2077, 1932, -145)
    text = click.unstyle(render_compare(comparison, width=100))
    assert "78 layers in A, 61 in B" in text and "75-77" in text


# ---- graph figures against plain SQL --------------------------------------------------------

@pytest.mark.parametrize("sample", [HEALTHY, BROKEN, DSV32_HEALTHY])
def test_graph_replays_nodes_and_launch_time_against_sql(sample):
    replays, nodes, host = [], [], []
    for step in steady_steps(sample.name):
        ids = ",".join(str(i) for i in step["graph_launch_correlation_ids"])
        [(launches, launch_ns)] = sql(
            sample, "SELECT count(*), sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                    f"ON s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%' AND r.correlationId IN ({ids})")
        [(node_rows,)] = sql(
            sample, f"SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE correlationId IN ({ids})) + "
                    f"(SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE correlationId IN ({ids}))")
        replays.append(launches)
        nodes.append(node_rows / launches)
        host.append(launch_ns / launches)
    ledger = DSV32 if sample == DSV32_HEALTHY else GLM
    comparison = compared(HEALTHY, GLM, sample, ledger)
    assert replays == [1, 1, 1]
    assert comparison.figure("graph_replays")[1] == 1
    assert comparison.figure("nodes_per_graph")[1] == statistics.median(nodes) == \
        MANIFEST[sample.name]["graph_kernels_per_step"]
    assert comparison.figure("graph_launch_ns_per_graph")[1] == statistics.median(host)
    # outside the graph: the sampling kernel's own launch
    assert comparison.figure("non_graph_launches")[1] == 1


# ---- real Kineto traces, SGLang vs vLLM, no ledger ------------------------------------------

def _kineto_step_figures(path: Path) -> dict:
    """Per the JSON alone (times as exact decimals in µs, to integer ns): the kernels of the
    trace's one engine step, their sum, union and span, and its graph launch."""
    events = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    [step] = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")]
    begin, end = step["ts"], step["ts"] + step["dur"]
    calls = [e for e in events if e.get("cat") == "cuda_runtime" and begin <= e["ts"] <= end]
    launched = {e["args"]["correlation"] for e in calls}
    kernels = sorted((int(e["ts"] * 1000), int(e["ts"] * 1000) + int(e["dur"] * 1000)) for e in events
                     if e.get("cat") == "kernel" and e["args"]["correlation"] in launched)
    busy, reach = 0, None
    for start, stop in kernels:
        busy += max(0, stop - max(start, reach if reach is not None else start))
        reach = stop if reach is None else max(reach, stop)
    graph = [e for e in calls if e["name"] in ("cudaGraphLaunch", "hipGraphLaunch")]
    graph_ids = {e["args"]["correlation"] for e in graph}
    return {
        "kernels": len(kernels), "kernel_ns": sum(b - a for a, b in kernels), "busy_ns": busy,
        "span_ns": max(b for _, b in kernels) - kernels[0][0], "graph_replays": len(graph),
        "nodes": sum(1 for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                     and e.get("args", {}).get("correlation") in graph_ids),
        "graph_launch_ns": sum(int(e["dur"] * 1000) for e in graph),
        "non_graph_launches": sum(1 for e in calls if "LaunchKernel" in e["name"]),
    }


@needs_shared(SGLANG_DECODE, VLLM_DECODE)
def test_real_sglang_vs_vllm_decode_without_a_ledger():
    comparison = compared(SGLANG_DECODE, None, VLLM_DECODE, None)
    assert comparison.kinds == ("decode",)
    assert comparison.a.steps == {"decode": (1, 1)} and comparison.b.steps == {"decode": (1, 1)}
    # no ledger: every kernel in "(no role)", none dropped
    [row] = comparison.role_rows("decode")
    sglang, vllm = _kineto_step_figures(SGLANG_DECODE), _kineto_step_figures(VLLM_DECODE)
    assert (sglang["kernels"], vllm["kernels"]) == (555, 425)
    assert (row.role, row.kernels_a, row.kernels_b, row.delta) == (NO_ROLE, 555, 425, -130)
    assert (row.ns_a, row.ns_b) == (sglang["kernel_ns"], vllm["kernel_ns"])
    for name in ("kernels", "kernel_ns", "busy_ns", "span_ns", "graph_replays", "non_graph_launches"):
        assert comparison.figure(name) == (sglang[name], vllm[name], vllm[name] - sglang[name]), name
    a, b, _ = comparison.figure("concurrency_ns")
    assert (a, b) == (sglang["kernel_ns"] - sglang["busy_ns"], vllm["kernel_ns"] - vllm["busy_ns"])
    assert comparison.figure("nodes_per_graph")[:2] == (sglang["nodes"], vllm["nodes"]) == (544, 421)
    assert comparison.figure("graph_launch_ns_per_graph")[:2] == (sglang["graph_launch_ns"], vllm["graph_launch_ns"])
    assert comparison.figure("graph_launch_ns_per_node")[:2] == pytest.approx(
        (sglang["graph_launch_ns"] / 544, vllm["graph_launch_ns"] / 421))
    assert comparison.layers.height == 0  # no layer attribution in these captures
    assert "(no role)" in click.unstyle(render_compare(comparison, width=100))


B200_PREFILL = KINETO_TRACES / "AMD-AGI__TraceLens__b200_eager_trace.json.gz"


@needs_shared(B200_PREFILL, SGLANG_DECODE)
def test_real_prefill_steps_compare_and_kinds_in_one_trace_only_are_said():
    """vLLM's B200 capture: one engine step, an 888-token prefill (its annotation says so)."""
    events = json.loads(gzip.decompress(B200_PREFILL.read_bytes()))["traceEvents"]
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    itself = compared(B200_PREFILL, None, B200_PREFILL, None)
    assert itself.kinds == ("prefill",)
    assert itself.figure("kernels", "prefill") == (kernels, kernels, 0) == (768, 768, 0)
    assert [(r.role, r.kernels_a, r.delta) for r in itself.role_rows("prefill")] == [(NO_ROLE, 768, 0)]
    apart = compared(B200_PREFILL, None, SGLANG_DECODE, None)
    assert apart.kinds == () and apart.roles.height == 0
    assert apart.notes == ("the two traces have no step kind in common: nothing to compare",
                           "decode steps only in B: not compared", "prefill steps only in A: not compared")
    assert click.unstyle(render_compare(apart, width=100)).startswith("nothing to compare")


GRAPH_LEVEL = KINETO_TRACES.parent / "morluto__flameox__nsight-2025.5.2.sqlite"


@needs_shared(GRAPH_LEVEL)
def test_a_graph_level_capture_is_said_not_compared_silently():
    """A real --cuda-graph-trace=graph export: its 2 replays have no kernel rows."""
    [(replays,)] = sql(GRAPH_LEVEL, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    assert replays == 2
    notes = compared(GRAPH_LEVEL, None, HEALTHY, GLM).notes
    assert "A was captured at graph level (2 replays without kernel rows): its kernel, role and layer figures " \
           "miss the kernels inside graphs; re-capture with `nsys profile --cuda-graph-trace=node`" in notes
    assert not any(note.startswith("B was captured") for note in notes)


# ---- renderers and the command --------------------------------------------------------------

def test_json_document_is_the_comparison_with_integers_as_integers():
    comparison = compared(HEALTHY, GLM, BROKEN, GLM)
    document = json.loads(json.dumps(compare_document(comparison)))
    assert document["schema_version"] == "1.0"
    [entry] = document["compared"]
    assert (entry["kind"], entry["rank"]) == ("decode", 0)
    assert entry["figures"]["kernels"] == {"label": "kernels", "unit": "count", "a": 2077, "b": 2233, "delta": 156}
    assert set(entry["figures"]) == {name for name, _, _ in STEP_FIGURES}
    quant = next(r for r in entry["roles"] if r["role"] == "ffn_quant")
    assert (quant["kernels_a"], quant["kernels_b"], quant["delta"]) == (75, 231, 156)
    assert isinstance(quant["kernels_a"], int) and isinstance(quant["ns_a"], int)
    assert entry["explaining_roles"][0] == "ffn_quant"
    assert len(entry["layers"]) == 78
    assert document["a"]["steps"] == {"decode": {"found": 4, "steady": 3}}
    schema_doc = (ROOT / "docs" / "json-schema.md").read_text()
    for field in [*document, *entry, *document["a"]]:
        assert f"`{field}`" in schema_doc, field


def test_markdown_and_html_hold_the_tables_and_load_nothing():
    comparison = compared(HEALTHY, GLM, BROKEN, GLM)
    markdown = render_compare_markdown(comparison)
    assert markdown.startswith("### nsys-ledger compare: B - A per decode step")
    assert "| ffn\\_quant | 75 | 231 | +156 |" in markdown
    page = render_compare_html(comparison)
    assert "ffn_quant" in page and "+156" in page
    # figures sort by value (ns or count), not as text: +389.70 µs after +53.13 µs
    assert '<td data-sort="156.0">+156</td>' in page and 'data-sort="2077.0">2,077<' in page
    assert page.count("<tr>") > 78  # one row per layer on the page
    # self-contained: nothing fetched (no script or style source, the CSP forbids the network),
    # and no chart, so no plotly.js inlined
    assert "<script src" not in page and "<link" not in page and "Content-Security-Policy" in page
    assert "plotly" not in page.lower()


def invoke(*args: str, columns: int = 100):
    return CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": str(columns)})


def test_cli_fits_100_columns_and_says_the_headline_first():
    result = invoke("compare", HEALTHY, BROKEN, "--expect", GLM)
    assert result.exit_code == 0, result.output
    lines = click.unstyle(result.output).splitlines()
    assert lines[0].startswith("B - A per decode step (median, rank 0): +156 kernels (+7.5%)")
    assert max(len(line) for line in lines) <= 100
    assert any(line.split()[:4] == ["ffn_quant", "75", "231", "+156"] for line in lines)


def test_cli_json_to_stdout_with_a_ledger_per_side():
    result = CliRunner().invoke(main, [
        "compare", str(HEALTHY), str(DSV32_HEALTHY), "--expect-a", str(GLM), "--expect-b", str(DSV32), "--json", "-"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["a"]["ledger_path"] == str(GLM) and document["b"]["ledger_path"] == str(DSV32)
    assert document["compared"][0]["figures"]["kernels"]["delta"] == -145
    assert "B - A per decode step" in result.stderr


def test_cli_writes_markdown_and_html(tmp_path):
    md, html = tmp_path / "c.md", tmp_path / "c.html"
    result = invoke("compare", HEALTHY, BROKEN, "--expect", GLM, "--markdown", md, "--html", html)
    assert result.exit_code == 0, result.output
    assert "ffn\\_quant" in md.read_text() and "<table" in html.read_text()


@pytest.mark.parametrize("args, message", [
    (("compare", "/no/such.sqlite", HEALTHY), "/no/such.sqlite: no such file"),
    (("compare", GLM, HEALTHY), "this is a ledger (expectations TOML), not a trace"),
    (("compare", HEALTHY, BROKEN, "--json", HEALTHY), "cannot write output (--json): it is the input"),
    (("compare", HEALTHY, BROKEN, "--expect", GLM, "--expect-a", GLM), "--expect gives one ledger for both"),
    (("compare", HEALTHY, BROKEN, "--expect-b", ROOT / "README.md"), "README.md"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


# ---- the acceptance pair: one model, SGLang against vLLM, each from its own topology ----
VLLM_GLM = ROOT / "expectations" / "glm-5.3-vllm-tp8-ep8.toml"
VLLM_HEALTHY = SAMPLES / "glm5-vllm-graph-healthy.sqlite"


def test_sglang_against_vllm_per_role_deltas_are_what_the_topologies_declare():
    from nsys_ledger.synth.schedule import role_counts_per_step

    declared_sglang = role_counts_per_step("glm-5.3-tp8-ep8")
    declared_vllm = role_counts_per_step("glm-5.3-vllm-tp8-ep8")
    declared = {role: declared_vllm.get(role, 0) - declared_sglang.get(role, 0)
                for role in set(declared_sglang) | set(declared_vllm)}
    comparison = compared(HEALTHY, GLM, VLLM_HEALTHY, VLLM_GLM)
    rows = {row.role: row for row in comparison.role_rows("decode")}
    assert NO_ROLE not in rows or rows[NO_ROLE].delta == 0
    observed = {role: row.delta for role, row in rows.items() if role != NO_ROLE}
    assert {role: d for role, d in observed.items() if d} == {role: d for role, d in declared.items() if d}
    # the figures, literally: the vLLM step launches 660 more kernels (2737 against 2077)
    assert comparison.figure("kernels", "decode")[:2] == (2077, 2737)
    assert rows["allreduce"].delta == 79 and rows["ffn_quant"].delta == 228
    assert rows["moe_dispatch"].delta == 75 and rows["page_table"].delta == 78
    # swapping A and B negates every role delta
    swapped = {row.role: row.delta for row in compared(VLLM_HEALTHY, VLLM_GLM, HEALTHY, GLM).role_rows("decode")}
    assert swapped == {role: -d for role, d in {row.role: row.delta for row in rows.values()}.items()}
