"""`nsys-ledger learn`: a ledger from a known-good capture, and the round trips it must survive."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from finding_sets import failures, layers_named

import nsys_ledger
from nsys_ledger.learn import LearnError, LearnOptions, learn, write_learned_ledger
from nsys_ledger.ledger.model import Range
from nsys_ledger.ledger import load_expectations, write_expectations
from shared_data import REAL_TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
REAL = REAL_TRACES
LLAMA3 = REAL / "Sh1mwww__llama3-inference__real_inference_simulation.sqlite"
NSYS_AI = REAL / "GindaChen__nsys-ai__h100_2gpu_1s.sqlite"

# graph-mode GLM-5.3 samples of the healthy topology (one rank, one decode graph per step)
FAULTED = [
    "glm5-graph-broken-fusion.sqlite", "glm5-graph-chunked-indexer.sqlite", "glm5-graph-extra-gaps.sqlite",
    "glm5-graph-extra-h2d.sqlite", "glm5-graph-split-graph.sqlite", "glm5-graph-layer41.sqlite",
    "glm5-graph-pageable-h2d.sqlite", "glm5-graph-caused-gaps.sqlite", "glm5-graph-boundary-gap.sqlite",
]


def _learned(tmp_path: Path, trace: Path, **options) -> Path:
    """Learn, write, and read back: what a user gets from `learn --out`."""
    out = tmp_path / f"{trace.stem}.toml"
    out.write_text(write_expectations(learn([trace], LearnOptions(**options))), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def from_healthy(tmp_path_factory) -> Path:
    return _learned(tmp_path_factory.mktemp("learn"), SAMPLES / "glm5-graph-healthy.sqlite",
                    base=load_expectations(GLM))


def test_learned_ledger_passes_its_own_trace(from_healthy):
    ledger = load_expectations(from_healthy)
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", ledger)
    assert result.verdict == "pass", [f.message for f in result.findings]
    anchors = {a.op: (a.formula, a.expected.low, a.expected.high) for a in ledger.anchors}
    assert anchors["fused_add_rmsnorm"] == ("2 * layers", 156, 156)
    assert anchors["sparse_mla"] == ("layers", 78, 78)
    assert anchors["paged_mqa_logits"] == ("full_indexer_layers", 21, 21)
    assert anchors["per_token_group_quant"] == ("moe_layers", 75, 75)
    assert (ledger.total.low, ledger.total.high) == (2077, 2077)
    assert ledger.graph_launches_per_step.low == ledger.graph_launches_per_step.high == 1
    assert (ledger.h2d.per_step.low, ledger.h2d.pageable_allowed) == (3, False)
    # classes: layers that launch the same kernels per group
    classes = {c.name: (len(c.layers), {g: r.low for g, r in c.groups.items()}) for c in ledger.layer_classes}
    assert sorted(n for n, _ in classes.values()) == [3, 18, 57]
    text = from_healthy.read_text()
    assert 'expected = "2 * layers"  # observed 156 in each of 4 decode steps (stable) = 2 * layers' in text
    assert 'layers = "6-74/4"' in text


def test_expectations_show_prints_the_learned_ledger(from_healthy):
    run = subprocess.run([sys.executable, "-m", "nsys_ledger.cli", "expectations", "show", str(from_healthy)],
                         capture_output=True, text=True, check=True)
    assert "fused_add_rmsnorm" in run.stdout and "2 * layers" in run.stdout


@pytest.mark.parametrize("sample", FAULTED)
def test_learned_ledger_fails_every_fault_like_the_hand_written_one(from_healthy, sample):
    hand = nsys_ledger.check(SAMPLES / sample, load_expectations(GLM))
    learned = nsys_ledger.check(SAMPLES / sample, load_expectations(from_healthy))
    assert hand.verdict == learned.verdict == "fail"
    hand_anchors, _ = failures(hand)
    learned_anchors, _ = failures(learned)
    assert hand_anchors <= learned_anchors
    # the same layers named, whether by a group count or by an edit of the layer's sequence
    assert layers_named(learned) == layers_named(hand)
    hand_checks = {f.check for f in hand.findings} - {"anchor", "layer", "layer_uniform", "layer_sequence"}
    assert hand_checks <= {f.check for f in learned.findings}


def test_ledger_learned_from_a_fault_fails_the_healthy_trace_inversely(tmp_path):
    ledger = _learned(tmp_path, SAMPLES / "glm5-graph-broken-fusion.sqlite", base=load_expectations(GLM))
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", load_expectations(ledger))
    anchor = next(f for f in result.findings if f.check == "anchor" and f.subject == "per_token_group_quant")
    assert (anchor.observed, anchor.expected) == ("75", "231")
    assert "too few" in anchor.message


def _plain_count(path: Path, sql: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchone()[0]


@needs_shared(LLAMA3)
def test_learn_on_the_llama3_layer_loop(tmp_path):
    ledger = load_expectations(_learned(tmp_path, LLAMA3, step_nvtx=r"^token_\d+_processing$"))
    steps = _plain_count(LLAMA3, "select count(*) from NVTX_EVENTS where text glob 'token_*_processing'")
    kernels = _plain_count(LLAMA3, "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL")
    sgemm = _plain_count(LLAMA3, "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s "
                                 "on s.id = k.demangledName where s.value like '%sgemm%'")
    layers = _plain_count(LLAMA3, "select count(distinct text) from NVTX_EVENTS where text glob 'layer_*_computation'")
    assert (steps, kernels, sgemm, layers) == (64, 1536, 512, 8)
    assert ledger.params["layers"] == layers
    assert (ledger.total.low, ledger.total.high) == (kernels // steps,) * 2
    anchors = {a.op: (a.formula, a.expected.low) for a in ledger.anchors}
    assert anchors["ampere_sgemm_128x64_nn"] == ("layers", sgemm // steps)
    assert anchors["distribution_elementwise_grid_stride_kernel"] == ("2 * layers", (kernels - sgemm) // steps)
    assert nsys_ledger.check(LLAMA3, ledger).verdict == "pass"


@needs_shared(NSYS_AI)
def test_learn_on_the_nsys_ai_capture(tmp_path):
    """A 1 s window of a 2-GPU capture without step ranges: each process's capture is a step."""
    ledger = load_expectations(_learned(tmp_path, NSYS_AI, step_method="capture"))
    per_device = _plain_count(NSYS_AI, "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL where deviceId = 0")
    other_device = _plain_count(NSYS_AI, "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL where deviceId = 1")
    h2d = _plain_count(NSYS_AI, "select count(*) from CUPTI_ACTIVITY_KIND_MEMCPY where copyKind = 1 and deviceId = 0")
    assert (per_device, other_device, h2d) == (1721, 1721, 225)
    assert (ledger.total.low, ledger.total.high) == (per_device, per_device)
    assert (ledger.h2d.per_step.low, ledger.h2d.pageable_allowed) == (h2d, True)
    result = nsys_ledger.check(NSYS_AI, ledger, step_method="capture")
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert sum(a.expected.low for a in ledger.anchors) == per_device


def test_learn_command(tmp_path):
    out = tmp_path / "learned.toml"
    run = subprocess.run(
        [sys.executable, "-m", "nsys_ledger.cli", "learn", str(SAMPLES / "glm5-graph-healthy.sqlite"),
         "--base", str(GLM), "--out", str(out)],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("learned ") and lines[0].endswith(f"total 2077 kernels per step -> {out}")
    assert lines[1] == "check of the same traces with it: PASS (all 53 checks passed on 4 decode steps)"


@needs_shared(LLAMA3)
def test_learn_command_on_a_trace_without_decode_steps(tmp_path):
    """One line, exit 2 (the llama3 export has no decode step by default: its steps are NVTX ranges)."""
    bad = subprocess.run(
        [sys.executable, "-m", "nsys_ledger.cli", "learn", str(LLAMA3), "--out", str(tmp_path / "x.toml")],
        capture_output=True, text=True,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "no decode step found" in bad.stderr


def test_learn_on_two_ranks_keeps_their_spread(tmp_path):
    """Two ranks whose busy time differs by 19.9%: above the base's 10%, so the learned limit
    is raised above what was seen (x1.25 = 25%), with a comment saying so."""
    sample = SAMPLES / "glm5-graph-2ranks-slow-rank1.sqlite"
    ledger_path = _learned(tmp_path, sample, base=load_expectations(GLM))
    ledger = load_expectations(ledger_path)
    assert ledger.rank_imbalance_pct == 25
    assert "# the known-good ranks differ by 19.9% in busy time (x1.25)" in ledger_path.read_text()
    assert nsys_ledger.check(sample, ledger).verdict == "pass"


@needs_shared(NSYS_AI)
def test_learned_rank_spread_is_never_tighter_than_ten_percent(tmp_path):
    """The nsys-ai capture's two ranks differ by well under 1% in busy time: the learned limit
    stays at 10%, not a fraction of a percent that any rerun would exceed."""
    ledger = load_expectations(_learned(tmp_path, NSYS_AI, step_method="capture"))
    result = nsys_ledger.check(NSYS_AI, ledger, step_method="capture")
    assert result.ranks.imbalance_pct < 1
    assert ledger.rank_imbalance_pct == 10


EVERY_TRACE = sorted(SAMPLES.glob("*.sqlite")) + sorted(SAMPLES.glob("*.json.gz")) + (
    sorted(REAL.glob("*.sqlite")) + sorted((REAL / "kineto").glob("*.json.gz")) if REAL.is_dir() else [])


@pytest.mark.parametrize("trace", EVERY_TRACE, ids=lambda p: p.name)
def test_learn_without_options_finds_checks_steps_and_its_ledger_passes(tmp_path, trace):
    """`learn` finds steps exactly as `check` without a ledger does: where check finds decode
    steps, learn succeeds, and its ledger passes the trace it came from on the same steps."""
    plain = nsys_ledger.check(trace)
    if plain.step_table.height == 0:
        with pytest.raises(LearnError, match="no decode step found"):
            learn([trace], LearnOptions())
        return
    ledger = load_expectations(_learned(tmp_path, trace))
    result = nsys_ledger.check(trace, ledger)
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert result.steps.method == plain.steps.method
    assert result.step_table.select("rank", "step", "kernels").rows() == plain.step_table.select(
        "rank", "step", "kernels").rows()


def test_a_contradictory_learned_ledger_is_refused_and_nothing_is_written(tmp_path, from_healthy):
    """The layer classes need 1965 kernels per step; a total of at most 8 contradicts them:
    validated before writing, the ledger is refused in one line and no file is left."""
    ledger = dataclasses.replace(load_expectations(from_healthy), total=Range(0, 8))
    target = tmp_path / "out" / "learned.toml"
    target.parent.mkdir()
    with pytest.raises(LearnError) as refused:
        write_learned_ledger(ledger, target)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the learned ledger does not hold together, nothing written")
    assert "the total allows at most 8" in message
    assert list(target.parent.iterdir()) == []


def test_counts_seen_in_fewer_than_three_steps_are_ranges_not_stable_anchors(tmp_path):
    """Two decode steps show a count once each: not enough to call it stable."""
    ledger_path = _learned(tmp_path, SAMPLES / "glm5-graph-healthy.sqlite", base=load_expectations(GLM),
                           from_steps=(0, 1))
    ledger = load_expectations(ledger_path)
    text = ledger_path.read_text()
    rms = next(a for a in ledger.anchors if a.op == "fused_add_rmsnorm")
    assert (rms.formula, rms.expected.low, rms.expected.high) == ("min 156, max 156", 156, 156)
    assert "(stable)" not in text
    assert "observed 156 in each of 2 decode steps (too few steps to call it stable: 3 or more needed)" in text
    assert nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", ledger).verdict == "pass"


SGLANG_QWEN3 = REAL / "kineto" / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"


def _idle_gaps_us(path: Path) -> list[float]:
    """Idle intervals between the merged GPU activities of a Kineto trace, in µs, from the JSON."""
    events = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    busy = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    gaps, end = [], busy[0][1]
    for start, stop in busy[1:]:
        if start > end:
            gaps.append(float(start - end))
        end = max(end, stop)
    return sorted(gaps)


@pytest.mark.skipif(not SGLANG_QWEN3.is_file(), reason="shared real traces not present")
def test_learned_gap_threshold_comes_from_the_distribution_not_the_worst_gap(tmp_path):
    """SGLang's real Qwen3-8B decode step idles 463 ms once (the launch was queued: the GPU waited
    on the device side) and at most 274 µs otherwise. The threshold is 2x the 99th percentile of
    the gaps above 2 µs with the longest left out (and the 50.8 µs step-entry gap before the
    replay's first kernel, allowed apart): 2 x 161.683 µs -> 324 µs; the stall is the one gap a
    step may show beyond it."""
    gaps = [g for g in _idle_gaps_us(SGLANG_QWEN3) if g > 2]
    assert gaps == [8.734, 14.743, 20.712, 50.837, 150.665, 161.683, 273.69, 463295.405]
    ledger_path = _learned(tmp_path, SGLANG_QWEN3)
    ledger = load_expectations(ledger_path)
    assert ledger.gap_threshold_ns == 324_000
    assert ledger.gaps_allowed_per_step == 1
    assert (ledger.step_entry_gaps.per_launch, ledger.step_entry_gaps.max_ns) == (1, 77_000)
    assert "1 known-good gap(s) beyond the threshold (the longest 463295.4 us, unknown)" in ledger_path.read_text()
    assert nsys_ledger.check(SGLANG_QWEN3, ledger).verdict == "pass"
    # a step with one more gap above 324 µs than the known-good one fails
    stricter = dataclasses.replace(ledger, gaps_allowed_per_step=0)
    failed = nsys_ledger.check(SGLANG_QWEN3, stricter)
    assert [f.check for f in failed.findings] == ["gaps"]
    assert failed.findings[0].message.startswith("idle gaps above 324 us: 1 per step in 1 of 1 steps")


def test_learn_writes_the_sequences_it_saw(tmp_path):
    """Without layer NVTX (SGLang's default under CUDA graphs): each class whose layers all
    launch one sequence in every step gets it, in issue order; the dense class does not (layer
    0 opens with a plain RMSNorm, layers 1-2 with the fused one). The learned sequence names the
    one extra kernel of layer 41 at its place, in one finding."""
    ledger_path = _learned(tmp_path, SAMPLES / "glm5-graph-no-nvtx-healthy.sqlite", base=load_expectations(GLM))
    ledger = load_expectations(ledger_path)
    sequences = {c.name: c.sequence for c in ledger.layer_classes}
    assert sorted(len(s) for s in sequences.values()) == [0, 23, 30]  # + the 7 indexer kernels
    moe = next(s for s in sequences.values() if len(s) == 23)
    assert [e.text() for e in moe[:4]] == ["fused_add_rmsnorm", "qkv_a_proj", "rmsnorm 2", "q_b_proj"]
    assert "all 228 layer-steps of the class launch exactly this sequence" in ledger_path.read_text()  # 57 x 4
    assert "no sequence: the commonest one is launched by 8 of 12 layer-steps" in ledger_path.read_text()
    faulted = nsys_ledger.check(SAMPLES / "glm5-graph-no-nvtx-layer41.sqlite", ledger)
    sequence_findings = [f for f in faulted.findings if f.check == "layer_sequence"]
    assert [(f.layers, f.observed) for f in sequence_findings] == [("41", "+ elementwise_kernel")]
