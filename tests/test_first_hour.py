"""The first hour with the CLI (issue 19): the terminal fits its width, integers print as
integers, and the options a new user tries first do what they say."""

from __future__ import annotations

import re
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.ledger import load_expectations
from nsys_ledger.report.layout import fit_lines, fit_table
from nsys_ledger.report.terminal import render
from shared_data import REFERENCE, needs_shared, real_params, real_sqlite_exports

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
EXPECTATIONS = ROOT / "expectations"
GLM = EXPECTATIONS / "glm-5.3-tp8-ep8.toml"


def widest(text: str) -> int:
    return max(len(click.unstyle(line)) for line in text.splitlines())


# ---- the terminal fits its width --------------------------------------------------------------

WIDTH_CASES = [
    ("glm5-graph-broken-fusion.sqlite", "glm-5.3-tp8-ep8.toml"),
    ("glm5-graph-healthy.sqlite", None),  # summary: the most launched kernels
    ("glm5-graph-2ranks-slow-rank1.sqlite", "glm-5.3-tp8-ep8.toml"),  # rank column, rank table
    ("glm5-mtp-graph-missing-draft.sqlite", "glm-5.3-tp8-ep8-mtp.toml"),
    ("glm5-eager-no-nvtx.sqlite", "glm-5.3-tp8-ep8.toml"),  # inferred layers: the longest prose
    ("dsv32-graph-layer41.sqlite", "deepseek-v3.2-tp8-ep8.toml"),
]


@pytest.mark.parametrize("sample, ledger", WIDTH_CASES)
def test_nothing_wraps_at_100_columns(sample, ledger):
    result = nsys_ledger.check(SAMPLES / sample, load_expectations(EXPECTATIONS / ledger) if ledger else None)
    unfitted = render(result, width=10_000)
    assert widest(unfitted) > 100  # the sample does have lines a fixed layout would print wider
    assert widest(render(result, width=100)) <= 100


def test_columns_sets_the_width_and_every_word_survives_the_wrapping():
    args = ["check", str(SAMPLES / "glm5-graph-broken-fusion.sqlite"), "--expect", str(GLM)]
    narrow = CliRunner().invoke(main, args, env={"COLUMNS": "72"})
    wide = CliRunner().invoke(main, args, env={"COLUMNS": "400"})
    assert narrow.exit_code == wide.exit_code == 1
    assert widest(narrow.output) <= 72 < widest(wide.output)
    # wrapped, not cut: the findings say the same words
    assert " ".join(narrow.output.split()).count("per_token_group_quant kernels: 231 per step, expected 75") == 1
    assert "in 4 of 4 steps (steps 0-3): too many" in " ".join(narrow.output.split())


def test_counts_print_as_integers_with_separators():
    result = nsys_ledger.check(SAMPLES / "glm5-graph-broken-fusion.sqlite", load_expectations(GLM))
    text = click.unstyle(render(result, width=100))
    assert "ops       2,233 decode kernels per step: specific op 2,076 (93.0%)" in text
    assert "2,233.0" not in text and "2,076.0" not in text
    step_rows = [line.split() for line in text.splitlines() if line.startswith("  0     5 ")]
    # step 0: 5 submissions, 2,233 kernels, 69.8 per token (2,233 / batch 32), time with a separator
    assert step_rows[0][:4] == ["0", "5", "2,233", "69.8"] and step_rows[0][-1] == "30,317.4"
    assert "per step (kernels/token: kernels per step / 32 tokens of the batch):" in text
    assert "k/token@" not in text


def test_a_wide_table_of_numbers_splits_into_blocks_that_repeat_the_key_column():
    rows = [("step", *(f"column_{i:02d}" for i in range(12)))] + [
        (str(step), *(f"{step * 1000 + i:,}" for i in range(12))) for step in range(3)
    ]
    lines = [click.unstyle(line) for line in fit_table(rows, 60)]
    assert max(map(len, lines)) <= 60
    headers = [line.split() for line in lines if line.strip().startswith("step")]
    # indent 2 + "step" 4 + 4 x (gap 2 + 9) = 50; a fifth column would make 61
    assert len(headers) == 3
    assert [h[1:] for h in headers][0] == ["column_00", "column_01", "column_02", "column_03"]
    assert [h[1] for h in headers] == ["column_00", "column_04", "column_08"]
    assert lines[1].split() == ["0", "0", "1", "2", "3"]


def test_a_wrapped_line_continues_under_its_label():
    line = "steps     " + " ".join(["word"] * 30)
    wrapped = fit_lines([line], 40)
    assert wrapped[0].startswith("steps     word") and all(w.startswith(" " * 10 + "word") for w in wrapped[1:])
    assert " ".join(" ".join(wrapped).split()) == " ".join(line.split())


# ---- options that did not do what they said --------------------------------------------------

HEALTHY = str(SAMPLES / "glm5-graph-healthy.sqlite")


def test_json_dash_writes_the_document_to_stdout_and_the_report_to_stderr(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", HEALTHY, "--expect", str(GLM), "--json", "-"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["verdict"] == "pass" and [s["kernels"] for s in document["steps"]] == [2077] * 4
    assert "PASS all 20 checks passed on 4 decode steps" in result.stderr
    assert not (tmp_path / "-").exists()
    diff = CliRunner().invoke(main, ["diff", HEALTHY, HEALTHY, "--json", "-"])
    assert diff.exit_code == 0 and json.loads(diff.stdout)["worse"] is False
    assert "NOT WORSE" in diff.stderr and not (tmp_path / "-").exists()


def test_a_step_nvtx_that_matches_nothing_is_said():
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", step_nvtx="no_such_range")
    count = result.trace.nvtx.height
    assert count == 4677  # the sample's NVTX ranges (the totals line prints the same figure)
    assert result.notices == (
        f"--step-nvtx /no_such_range/ matches none of the trace's {count:,} NVTX ranges: steps found by graph instead",
    )
    forced = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", step_nvtx="no_such_range", step_method="nvtx")
    assert forced.notices[-1].endswith(": no decode step found") and forced.step_table.height == 0
    matching = nsys_ledger.check(SAMPLES / "glm5-eager-healthy.sqlite", step_nvtx="decode bs=")
    assert not any("--step-nvtx" in notice for notice in matching.notices)


def test_synth_lists_its_faults():
    from nsys_ledger.synth import FAULTS
    from nsys_ledger.synth.generate import TOPOLOGY_FAULTS

    assert "--list-faults" in CliRunner().invoke(main, ["synth", "--help"]).output
    result = CliRunner().invoke(main, ["synth", "--list-faults"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == list(FAULTS + TOPOLOGY_FAULTS)
    assert all(len(line.split()) > 3 for line in lines)  # each one described
    assert lines[0] == ("broken_fusion          norm+quant fusion broken: per_token_group_quant alone "
                        "(231 per step, not 75)")
    assert max(map(len, lines)) <= 100


def test_synth_kineto_gets_the_documented_suffix(tmp_path):
    result = CliRunner().invoke(main, ["synth", str(tmp_path / "run"), "--format", "kineto", "--steps", "1"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["run.trace.json.gz"]
    assert result.output.startswith(f"wrote {tmp_path / 'run.trace.json.gz'}: ")
    named = CliRunner().invoke(main, ["synth", str(tmp_path / "mine.json.gz"), "--format", "kineto", "--steps", "1"])
    assert named.exit_code == 0 and (tmp_path / "mine.json.gz").is_file()
    checked = nsys_ledger.check(tmp_path / "run.trace.json.gz", load_expectations(GLM))
    assert checked.step_table["kernels"].to_list() == [2077]


# ---- the wrong ledger for the trace -------------------------------------------------------------

def test_a_ledger_for_another_model_says_the_layer_counts_first():
    deepseek = SAMPLES / "dsv32-graph-healthy.sqlite"  # DeepSeek-V3.2: 61 layers
    result = nsys_ledger.check(deepseek, load_expectations(GLM))  # GLM-5.3's ledger: 78
    first = result.findings[0]
    assert first.message == (
        "the trace has 61 layers per decode step, the ledger 78 (layers 0-77): a ledger for another model? "
        "The per-layer, sequence and anchor findings below follow from it")
    assert (first.observed, first.expected, first.steps, first.failing_steps) == ("61", "78", "0-3", 4)
    # 1 layer count, 5 anchors, 7 kernel-sequence edits (the moe layers without the indexer in
    # GLM-5.3's ledger run DeepSeek-V3.2's 7 indexer kernels), 4 per-layer groups of layers 61-77
    assert result.outcomes[0].name == "layer count" and len(result.findings) == 17
    assert [f.check for f in result.findings].count("layer_sequence") == 7
    text = click.unstyle(render(result, width=1000))
    assert text.index("FAIL 17 finding(s)") < text.index("the trace has 61 layers") < text.index("[anchors.")
    # the other way round, and not at all when the ledger fits
    glm_trace = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", EXPECTATIONS / "deepseek-v3.2-tp8-ep8.toml")
    assert glm_trace.findings[0].message.startswith("the trace has 78 layers per decode step, the ledger 61 ")
    for sample, ledger in [(deepseek, "deepseek-v3.2-tp8-ep8.toml"), (SAMPLES / "glm5-graph-healthy.sqlite", GLM),
                           (SAMPLES / "glm5-mtp-graph-healthy.sqlite", "glm-5.3-tp8-ep8-mtp.toml")]:
        fitting = nsys_ledger.check(sample, EXPECTATIONS / ledger)
        assert fitting.verdict == "pass" and "layer count" not in [o.name for o in fitting.outcomes]


# ---- one kernel name whatever demangled it ------------------------------------------------------

def test_canonical_kernel_names_of_both_demanglers():
    from nsys_ledger.attribution.kernel_names import canonical_kernel_name

    nsys = ("void at::native::<unnamed>::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, (int)2, (int)2, "
            "(int)-2>(at::cuda::detail::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>, int, long)")
    cxxfilt = ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, "
               "-2>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, int, long)")
    assert canonical_kernel_name(nsys) == canonical_kernel_name(cxxfilt) == (
        "at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>")
    assert canonical_kernel_name("void k<(bool)1, (unsigned int)6144>(int *)") == "k<true, 6144>"
    assert canonical_kernel_name("void k<true, 6144u>(int*)") == "k<true, 6144>"
    assert canonical_kernel_name("nvjet_tst_128x8_64x12_1x1_h_bz_TNT") == "nvjet_tst_128x8_64x12_1x1_h_bz_TNT"


@needs_shared(REFERENCE / "real-kernel-names.tsv")
def test_canonical_names_of_the_real_kernel_names():
    import csv

    from nsys_ledger.attribution.kernel_names import canonical_kernel_name

    with open(REFERENCE / "real-kernel-names.tsv", newline="") as fh:
        names = [row["kernel_name"] for row in csv.DictReader(fh, delimiter="\t")]
    canonical = {name: canonical_kernel_name(name) for name in names}
    assert len(names) == 82
    residue = re.compile(r"\((?:unsigned )?(?:int|long|bool)\)|<unnamed>|\b\d+u\b")
    assert [c for c in canonical.values() if residue.search(c)] == []
    assert all(canonical_kernel_name(c) == c for c in canonical.values())  # a canonical name stays itself
    silu = next(n for n in names if "act_and_mul_kernel" in n and n.startswith("void flashinfer"))
    assert canonical[silu] == "flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>"
    nsys_deepgemm = next(n for n in names if "(unsigned int)2112, (unsigned int)7168" in n)
    assert canonical[nsys_deepgemm].startswith("deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 0, 2112, 7168, 1,")


def test_a_diff_of_the_same_timeline_across_formats_lists_no_kernel_name():
    from nsys_ledger.diff import diff_results

    glm = load_expectations(GLM)
    sqlite = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", glm)
    kineto = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.trace.json.gz", glm)
    decode = (pl.col("activity") == "kernel") & pl.col("decode").fill_null(False)
    names = lambda r: set(r.steps.activities.filter(decode)["name"].unique())  # noqa: E731
    assert len(names(sqlite) - names(kineto)) == 27  # the templated names are spelled otherwise (nsys, c++filt) ...
    diff = diff_results(sqlite, kineto)
    assert diff.new_kernels.height == 0 and diff.vanished_kernels.height == 0  # ... the kernels do not
    stray = diff_results(kineto, nsys_ledger.check(SAMPLES / "glm5-graph-layer41.sqlite", glm))
    assert stray.new_kernels.height == 1 and stray.vanished_kernels.height == 0  # only layer 41's stray kernel
    assert stray.new_kernels["name"][0].startswith("void at::native::elementwise_kernel<(int)128, (int)2, ")


# ---- the Chrome trace: findings on the kernel they are about, launches linked to kernels --------

def test_chrome_trace_puts_findings_on_the_offending_kernel_and_links_launches():
    from nsys_ledger.report.chrome_trace import GAPS_TID, chrome_trace_document, gpu_pid, host_pid
    from nsys_ledger.report.selection import select_steps

    result = nsys_ledger.check(SAMPLES / "glm5-graph-layer41.sqlite", load_expectations(GLM))
    events = chrome_trace_document(result)["traceEvents"]
    findings = [e for e in events if e.get("cat") == "finding"]
    assert len(findings) == 2  # the one finding (layer 41), in each of the two drawn steps
    kernels = {(e["pid"], e["tid"], e["ts"]): e for e in events if e.get("cat") == "kernel"}
    for finding in findings:
        assert finding["s"] == "t" and finding["tid"] != GAPS_TID  # on a stream's track, not global
        kernel = kernels[(finding["pid"], finding["tid"], finding["ts"])]  # exactly at a kernel's start
        # layer 41's stray kernel (no op), not the layer's first kernel
        assert kernel["name"].startswith("void at::native::elementwise_kernel<(int)128, (int)2, ")
        assert kernel["args"]["layer"] == 41 and kernel["args"]["op"] == "other"  # no op of the ledger
        assert finding["args"]["on"] == kernel["name"]

    starts = [e for e in events if e["ph"] == "s" and e.get("cat") == "launch"]
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e.get("cat") == "launch"}
    # per drawn step: 3 H2D copies, the graph launch, the sampling kernel's launch
    assert len(starts) == len(ends) == 10 == 5 * len(select_steps(result))
    calls = {(e["pid"], e["tid"], e["ts"]) for e in events if str(e.get("cat")).startswith("api_")}
    activities = {(e["pid"], e["tid"], e["ts"]) for e in events if e.get("cat") in ("kernel", "memcpy", "memset")}
    for start in starts:
        end = ends[start["id"]]
        assert (start["pid"], start["tid"], start["ts"]) in calls and start["pid"] == host_pid(0)
        assert (end["pid"], end["tid"], end["ts"]) in activities and end["pid"] == gpu_pid(0, 0)
        assert end["bp"] == "e" and end["ts"] >= start["ts"]
    # a gap finding sits on the longest gap of the step, on the gaps track
    gaps = nsys_ledger.check(SAMPLES / "glm5-graph-extra-gaps.sqlite", load_expectations(GLM))
    gap_findings = [e for e in chrome_trace_document(gaps)["traceEvents"] if e.get("cat") == "finding"]
    assert gap_findings and all(e["tid"] == GAPS_TID and e["args"]["on"] == "gap: unknown" for e in gap_findings)


def test_ledger_commands_fit_100_columns_too():
    show = CliRunner().invoke(main, ["expectations", "show", str(GLM)], env={"COLUMNS": "100"})
    wide = CliRunner().invoke(main, ["expectations", "show", str(GLM)], env={"COLUMNS": "1000"})
    assert show.exit_code == wide.exit_code == 0
    assert widest(show.output) <= 100 < widest(wide.output)
    assert "  layers              = 78" in show.output.splitlines()
    deepseek = str(EXPECTATIONS / "deepseek-v3.2-tp8-ep8.toml")
    diff = CliRunner().invoke(main, ["expectations", "diff", str(GLM), deepseek], env={"COLUMNS": "100"})
    assert diff.exit_code == 1 and widest(diff.output) <= 100
    assert "~ params.layers: 78 -> 61" in " ".join(diff.output.split())


@pytest.mark.parametrize("path", real_params(real_sqlite_exports()))
def test_real_exports_fit_100_columns(path):
    import sqlite3

    result = nsys_ledger.check(path)
    text = click.unstyle(render(result, width=100))
    assert widest(text) <= 100
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    # the totals line, wrapped or not, names the kernel count plain SQL gives, as an integer
    assert f"totals    {kernels:,} kernels" in text


def test_diff_figures_print_whole_numbers_as_integers():
    from nsys_ledger.diff import _fmt

    assert [_fmt(1_000_000.0), _fmt(2002.0), _fmt(1.5), _fmt(None)] == ["1000000", "2002", "1.500", "-"]
