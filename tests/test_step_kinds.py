"""Step kinds (decode, prefill, mixed) on the real PyTorch-profiler traces of vLLM and SGLang in
../shared/real_traces/kineto/, and the ledger's [kinds.KIND] sections.

The expected counts per kind are read from each file's own step annotations with `json` and a
plain parse in this file (`_annotated_kinds`), not with the tool's regexes. The files hold
decode steps (vLLM FULL graph, SGLang Qwen3-8B) and one prefill step (vLLM on B200); there is
no real mixed step among them, so the mixed step is the B200 trace with its one annotation
renamed the way vLLM names a step that schedules prefill and decode requests together.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import polars as pl
import pytest

from nsys_ledger.api import check
from nsys_ledger.attribution.step_kinds import annotation_kind, kind_by_kernels
from nsys_ledger.ledger import load_expectations

REPO = Path(__file__).resolve().parents[1]


def _shared() -> Path:
    env = os.environ.get("NSYS_LEDGER_REAL_TRACES")
    return Path(env).parent if env else REPO.parent / "shared"


KINETO_DIR = _shared() / "real_traces" / "kineto"
KERNEL_NAMES = _shared() / "reference" / "real-kernel-names.tsv"
needs_traces = pytest.mark.skipif(not KINETO_DIR.is_dir(), reason=f"no real Kineto traces at {KINETO_DIR}")

B200 = "AMD-AGI__TraceLens__b200_eager_trace.json.gz"
SGLANG_DECODE = "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
VLLM_DECODE = "AMD-AGI__TraceLens__inference_vllm_decode_full_graph_execution.json.gz"
B200_ANNOTATION = "execute_context_1(888_788544)_generation_0(0)"


def _events(name: str) -> list[dict]:
    with gzip.open(KINETO_DIR / name, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def _plain_kind(name: str) -> str | None:
    """The kind an annotation names, parsed by hand: ``..._context_N(...)_generation_M(...)``
    or ``step[MODE ...]``."""
    if name.startswith("step["):
        return {"DECODE": "decode", "EXTEND": "prefill", "MIXED": "mixed"}.get(name[5:].split(" ")[0].rstrip("]"))
    if not name.startswith("execute_") or "_context_" not in name or ")_generation_" not in name:
        return None
    context = int(name.split("_context_")[1].split("(")[0])
    generation = int(name.split(")_generation_")[1].split("(")[0])
    return {(True, True): "mixed", (True, False): "prefill", (False, True): "decode"}.get((context > 0, generation > 0))


def _annotated_kinds(events: list[dict]) -> dict[str, int]:
    """Steps per kind from the host annotations: one per `execute_...` range (SGLang's
    `step[...]` range lies inside its `execute_...` range: the same step)."""
    counts: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("execute_"):
            kind = _plain_kind(e["name"])
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def _found(result) -> dict[str, int]:
    return {kind: found for kind, found, _, _ in result.step_kinds.iter_rows()}


def _write_renamed(tmp_path: Path, name: str, renames: dict[str, str]) -> Path:
    """The real trace with some annotations renamed (host and GPU copies alike)."""
    with gzip.open(KINETO_DIR / name, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") in ("user_annotation", "gpu_user_annotation") and e.get("name") in renames:
            e["name"] = renames[e["name"]]
    out = tmp_path / name
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    return out


def _ledger(tmp_path: Path, kinds: str) -> Path:
    path = tmp_path / "kinds.toml"
    path.write_text(
        '[model]\nname = "B200 engine steps"\n\n[steps]\nmethod = "nvtx"\nnvtx = \'^execute_\'\n\n'
        '[ops.context_attention]\npatterns = [\'^fmhaSm\\d+\\w*Context$\']\n\n' + kinds,
        encoding="utf-8",
    )
    return path


# ---- annotations and kernels, by name ---------------------------------------------------------


def test_engine_annotations_name_their_kind():
    assert annotation_kind(B200_ANNOTATION) == "prefill"
    assert annotation_kind("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)") == "decode"
    assert annotation_kind("execute_context_2(1024_2048)_generation_30(30_9000)") == "mixed"
    assert annotation_kind("execute_context_0(0)_generation_0(0)") is None
    assert annotation_kind("step[DECODE bs=32]") == "decode"
    assert annotation_kind("step[EXTEND bs=4]") == "prefill"
    assert annotation_kind("step[MIXED bs=8]") == "mixed"
    assert annotation_kind("step[IDLE bs=0]") is None
    assert annotation_kind("ProfilerStep#6") is None


@needs_traces
@pytest.mark.parametrize(("name", "expected"), [(B200, {"prefill": 1}), (SGLANG_DECODE, {"decode": 1}),
                                                (VLLM_DECODE, {"decode": 1})])
def test_real_annotations_read_as_by_hand(name, expected):
    events = _events(name)
    annotations = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    told = {n: annotation_kind(n) for n in annotations if _plain_kind(n) is not None}
    assert told == {n: _plain_kind(n) for n in told}
    assert _annotated_kinds(events) == expected


@needs_traces
def test_real_attention_kernels_tell_the_kind():
    b200 = [e["name"] for e in _events(B200) if e.get("cat") == "kernel"]
    assert sum(n.endswith("PersistentContext") for n in b200) == 36
    assert kind_by_kernels(b200) == "prefill"
    for name in (SGLANG_DECODE, VLLM_DECODE):  # paged_attention_ll4mi, kernel_unified_attention
        assert kind_by_kernels([e["name"] for e in _events(name) if e.get("cat") == "kernel"]) == "decode"


@pytest.mark.skipif(not KERNEL_NAMES.is_file(), reason=f"no real kernel names at {KERNEL_NAMES}")
def test_real_fmha_names_from_serving_traces():
    rows = [line.split("\t") for line in KERNEL_NAMES.read_text(encoding="utf-8").splitlines()[1:]]
    fmha = [row[3] for row in rows if row[3].startswith("fmhaSm")]
    context = [n for n in fmha if n.endswith("Context")]
    generation = [n for n in fmha if n.endswith("ForGen")]
    assert len(context) == 1 and len(generation) == 4
    assert kind_by_kernels(context) == "prefill"
    assert kind_by_kernels(generation) == "decode"
    assert kind_by_kernels(context + generation) == "mixed"


# ---- whole traces ---------------------------------------------------------------------------------


@needs_traces
@pytest.mark.parametrize("name", [B200, SGLANG_DECODE, VLLM_DECODE])
def test_kinds_found_equal_the_files_annotations(name):
    result = check(KINETO_DIR / name)
    assert _found(result) == _annotated_kinds(_events(name))
    assert result.steps.windows["kind_source"].str.starts_with("annotation 'execute_").all()


@needs_traces
def test_real_prefill_step_is_counted_not_dropped():
    result = check(KINETO_DIR / B200)
    assert result.step_kinds.rows() == [("prefill", 1, 0, False)]
    assert result.steps.excluded["reason"].to_list() == [f"a prefill step, by annotation '{B200_ANNOTATION}'"]


@needs_traces
def test_real_prefill_step_checked_against_a_prefill_section(tmp_path):
    kernels = sum(1 for e in _events(B200) if e.get("cat") == "kernel")
    assert kernels == 768
    ledger = _ledger(tmp_path, "[kinds.prefill.total]\nexpected = 768\n\n"
                               "[kinds.prefill.anchors.context_attention]\nexpected = 36\n")
    result = check(KINETO_DIR / B200, load_expectations(ledger))
    assert result.step_kinds.rows() == [("prefill", 1, 1, True)]
    assert result.verdict == "pass"
    assert [(o.name, o.observed) for o in result.outcomes] == [
        ("prefill steps: anchor context_attention", "36"), ("prefill steps: total kernels per step", "768")]


@needs_traces
def test_mixed_step_is_checked_against_a_mixed_section(tmp_path):
    mixed = "execute_context_1(888_788544)_generation_3(3_2400)"
    trace = _write_renamed(tmp_path, B200, {B200_ANNOTATION: mixed})
    assert _annotated_kinds(_events_of(trace)) == {"mixed": 1}

    healthy = check(trace, load_expectations(_ledger(tmp_path, "[kinds.mixed.total]\nexpected = 768\n")))
    assert healthy.step_kinds.rows() == [("mixed", 1, 1, True)]
    assert healthy.verdict == "pass"

    short = check(trace, load_expectations(_ledger(tmp_path, "[kinds.mixed.total]\nexpected = 800\n")))
    assert [(f.check, f.source, f.observed, f.expected) for f in short.findings] == [
        ("kind_total", "kinds.mixed.total", "768", "800")]

    # a ledger with a prefill section only: the mixed step is counted, not checked, and the
    # trace has no step that the ledger can check
    undeclared = check(trace, load_expectations(_ledger(tmp_path, "[kinds.prefill.total]\nexpected = 768\n")))
    assert undeclared.step_kinds.rows() == [("mixed", 1, 0, False)]
    assert [f.check for f in undeclared.findings] == ["steps"]


@needs_traces
def test_sglang_step_annotation_inside_a_step_range(tmp_path):
    """With no `execute_...` range, a step range (here `ProfilerStep#1`) takes its kind from
    SGLang's `step[MODE bs=N]` range that starts inside it."""
    execute = next(e["name"] for e in _events(SGLANG_DECODE)
                   if e.get("cat") == "user_annotation" and e["name"].startswith("execute_"))
    decode = check(_write_renamed(tmp_path, SGLANG_DECODE, {execute: "ProfilerStep#1"}))
    assert decode.steps.windows.select("kind", "kind_source").rows() == [("decode", "annotation 'step[DECODE bs=32]'")]
    mixed = check(_write_renamed(tmp_path, SGLANG_DECODE,
                                 {execute: "ProfilerStep#1", "step[DECODE bs=32]": "step[MIXED bs=32]"}))
    assert mixed.step_kinds.rows() == [("mixed", 1, 0, False)]


@needs_traces
def test_without_annotation_the_kernels_tell_a_prefill_step(tmp_path):
    trace = _write_renamed(tmp_path, B200, {B200_ANNOTATION: "ProfilerStep#1"})
    result = check(trace)
    assert result.steps.windows.select("kind", "kind_source").rows() == [("prefill", "kernels: prefill attention")]
    assert result.step_kinds.rows() == [("prefill", 1, 0, False)]


def _events_of(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


@needs_traces
def test_learn_learns_each_kind_it_sees(tmp_path):
    """Two real traces learnt together (two ranks): the vLLM FULL-graph decode step and the B200
    prefill step; the learned ledger has a [kinds.prefill] section that passes its trace."""
    from nsys_ledger.learn import LearnOptions, learn, learned_ledger_text

    ledger = learn([KINETO_DIR / VLLM_DECODE, KINETO_DIR / B200], LearnOptions())
    assert sorted(ledger.kinds) == ["prefill"]
    assert ledger.kinds["prefill"].total.low == 768 and ledger.kinds["prefill"].total.high == 768
    assert ledger.total.low == 425 and ledger.total.high == 425
    text = learned_ledger_text(ledger)
    assert "[kinds.prefill.total]\nmin = 768  # kernels per step: observed 768 in each of 1 prefill steps" in text
    path = tmp_path / "learned.toml"
    path.write_text(text, encoding="utf-8")
    result = check(KINETO_DIR / B200, load_expectations(path))
    assert result.step_kinds.rows() == [("prefill", 1, 1, True)]
    assert not [f for f in result.findings if f.source.startswith("kinds.")]


@needs_traces
def test_reports_say_how_many_steps_of_each_kind(tmp_path):
    from nsys_ledger.report.json_report import result_document
    from nsys_ledger.report.terminal import render

    result = check(KINETO_DIR / B200)
    assert result_document(result)["step_detection"]["kinds"] == [
        {"kind": "prefill", "found": 1, "checked": 0, "declared": False}]
    kinds_line = next(line for line in render(result).splitlines() if line.startswith("kinds"))
    assert kinds_line == "kinds     steps found/checked: prefill 1/0 without a ledger"
    ledger = _ledger(tmp_path, "[kinds.prefill.total]\nexpected = 768\n")
    declared = render(check(KINETO_DIR / B200, load_expectations(ledger)))
    assert "kinds     steps found/checked: prefill 1/1" in declared.splitlines()


# ---- NVTX step annotations in an nsys export ----------------------------------------------------

SAMPLES = REPO / "sample_traces"


def test_nvtx_step_annotations_give_kinds(tmp_path):
    """SGLang's NVTX step ranges in an nsys export: the bundled eager sample's `decode bs=32` and
    `prefill bs=32` ranges renamed as SGLang names its steps (one decode step as a mixed one)."""
    import shutil
    import sqlite3

    path = tmp_path / "sglang-steps.sqlite"
    shutil.copyfile(SAMPLES / "glm5-eager-healthy.sqlite", path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE NVTX_EVENTS SET text = 'step[EXTEND bs=32]' WHERE text = 'prefill bs=32'")
        db.execute("UPDATE NVTX_EVENTS SET text = 'step[DECODE bs=32]' WHERE text = 'decode bs=32'")
        last = db.execute("SELECT max(start) FROM NVTX_EVENTS WHERE text = 'step[DECODE bs=32]'").fetchone()[0]
        db.execute("UPDATE NVTX_EVENTS SET text = 'step[MIXED bs=32]' WHERE start = ? AND text = 'step[DECODE bs=32]'",
                   (last,))
        counted = dict(db.execute("SELECT text, count(*) FROM NVTX_EVENTS WHERE text LIKE 'step[%' GROUP BY text"))
    assert counted == {"step[DECODE bs=32]": 3, "step[EXTEND bs=32]": 1, "step[MIXED bs=32]": 1}

    result = check(path, step_nvtx=r"^step\[")
    assert result.steps.method == "nvtx"
    assert result.step_kinds.rows() == [("decode", 3, 0, False), ("prefill", 1, 0, False), ("mixed", 1, 0, False)]
    assert result.step_table.height == 3
    assert sorted(result.steps.excluded["reason"].to_list()) == [
        "a mixed step, by annotation 'step[MIXED bs=32]'", "a prefill step, by annotation 'step[EXTEND bs=32]'"]


def _graph_sample_with_vllm_ranges(tmp_path: Path) -> Path:
    """The bundled graph-mode sample with vLLM's step ranges added on the launching thread: one
    around each cudaGraphLaunch (the last one a mixed step) and one around the eager prefill."""
    import shutil
    import sqlite3

    path = tmp_path / "vllm-steps.sqlite"
    shutil.copyfile(SAMPLES / "glm5-graph-healthy.sqlite", path)
    with sqlite3.connect(path) as db:
        launches = db.execute(
            "SELECT r.start, r.end, r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value LIKE 'cudaGraphLaunch%' ORDER BY r.start").fetchall()
        prefill = db.execute("SELECT start, end, globalTid FROM NVTX_EVENTS WHERE text LIKE "
                             "'{''Module'': ''model'', %[[16384], [16384]]}'").fetchone()
        names = ["execute_context_0(0)_generation_32(32)"] * (len(launches) - 1) + \
            ["execute_context_2(4096)_generation_30(30)"]
        rows = [(start - 500, end + 10, tid, name) for (start, end, tid), name in zip(launches, names)]
        rows.append((prefill[0] - 100, prefill[1] + 100, prefill[2], "execute_context_1(16384)_generation_0(0)"))
        db.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (?, ?, 59, ?, ?)", rows)
    return path


def test_nvtx_ranges_inside_graph_steps_give_kinds(tmp_path):
    """Steps cut at the graph launches and sampling kernels (no step range given) take their
    kind from the vLLM step range that starts inside them."""
    result = check(_graph_sample_with_vllm_ranges(tmp_path))
    assert result.steps.method == "graph"
    windows = result.steps.windows.filter(pl.col("kind_source").str.starts_with("annotation"))
    assert windows.select("kind", "graph_launches").rows() == [("prefill", 0), ("decode", 1), ("decode", 1),
                                                               ("decode", 1), ("mixed", 1)]
    assert result.step_table.height == 3
    assert dict((k, f) for k, f, _, _ in result.step_kinds.iter_rows()) == {"decode": 3, "prefill": 1, "mixed": 1}


def test_mixed_graph_step_checked_against_the_glm_ledgers_mixed_section(tmp_path):
    """The GLM-5.3 ledger with a [kinds.mixed] section: the sample's mixed step (a healthy
    decode step's kernels: 2077, 156 fused_add_rmsnorm) passes it, and a wrong count names it."""
    glm = (REPO / "expectations" / "glm-5.3-tp8-ep8.toml").read_text(encoding="utf-8")
    trace = _graph_sample_with_vllm_ranges(tmp_path)

    def checked(total: int):
        path = tmp_path / f"glm-mixed-{total}.toml"
        path.write_text(glm + f"\n[kinds.mixed.total]\nexpected = {total}\n\n"
                              "[kinds.mixed.anchors.fused_add_rmsnorm]\nexpected = 156\n", encoding="utf-8")
        return check(trace, load_expectations(path))

    healthy = checked(2077)
    assert dict((k, c) for k, _, c, _ in healthy.step_kinds.iter_rows()) == {"decode": 3, "prefill": 0, "mixed": 1}
    mixed = [(o.name, o.observed, o.passed) for o in healthy.outcomes if o.source.startswith("kinds.")]
    assert mixed == [("mixed steps: anchor fused_add_rmsnorm", "156", True),
                     ("mixed steps: total kernels per step", "2077", True)]
    wrong = checked(1990)
    assert [(f.check, f.observed, f.expected, f.steps) for f in wrong.findings if f.source.startswith("kinds.")] == [
        ("kind_total", "2077", "1990", "0")]


@needs_traces
def test_verdict_names_the_steps_of_other_kinds_it_checked(tmp_path):
    ledger = _ledger(tmp_path, "[kinds.prefill.total]\nexpected = 768\n")
    result = check(KINETO_DIR / B200, load_expectations(ledger))
    assert result.verdict_sentence == "all 1 checks passed on 0 decode steps and 1 prefill step"
