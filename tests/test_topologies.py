"""Deployments beyond GLM-5.3 TP8: GLM-5.3 with DP attention, GLM-5.3 with MTP, DeepSeek-V3.2.

Each has a hand-written ledger in expectations/ and a healthy and a faulted sample generated
from its reference schedule (synth/topologies.py); the two are independent statements of the
seed and the public configs, so each must pass the healthy sample and name the fault of the
faulted one. `learn` must round-trip them: learned from the healthy sample with the hand
ledger as base, the ledger passes it and fails the faulted one on the same anchors and layers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from finding_sets import failures, layers_named
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.learn import LearnOptions, learn
from nsys_ledger.ledger import load_expectations, write_expectations
from nsys_ledger.synth import generate
from nsys_ledger.synth.samples import SAMPLES as SAMPLE_KWARGS
from nsys_ledger.synth.samples import SEED, STEPS
from nsys_ledger.synth.schedule import decode_schedule

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
EXPECTATIONS = ROOT / "expectations"

DP8 = "glm-5.3-dp8-ep8"
MTP = "glm-5.3-tp8-ep8-mtp"
DSV32 = "deepseek-v3.2-tp8-ep8"
# topology -> (healthy sample, faulted sample)
TOPOLOGY_SAMPLES = {
    DP8: ("glm5-dp8-graph-healthy.sqlite", "glm5-dp8-graph-broken-fusion.sqlite"),
    MTP: ("glm5-mtp-graph-healthy.sqlite", "glm5-mtp-graph-missing-draft.sqlite"),
    DSV32: ("dsv32-graph-healthy.sqlite", "dsv32-graph-layer41.sqlite"),
}


def _ledger(topology: str):
    return load_expectations(EXPECTATIONS / f"{topology}.toml")


@pytest.fixture(scope="module")
def checked():
    """(sample, ledger path) -> Result, each checked once per module."""
    cache: dict[tuple[str, str], nsys_ledger.Result] = {}

    def get(sample: str, ledger: Path) -> nsys_ledger.Result:
        key = (sample, str(ledger))
        if key not in cache:
            cache[key] = nsys_ledger.check(SAMPLES / sample, load_expectations(ledger))
        return cache[key]

    return get


def _per_step(result, column: str) -> set:
    return set(result.step_table[column].to_list())


def _op_per_step(result, op: str) -> set:
    return set(result.op_table[op].to_list())


# ---- the reference schedules: what each topology launches -----------------------------------


def test_schedules_count_what_the_seed_and_the_configs_say():
    tp8 = decode_schedule(32)
    dp8 = decode_schedule(32, topology=DP8)
    mtp = decode_schedule(32, topology=MTP)
    dsv32 = decode_schedule(32, topology=DSV32)
    assert len(tp8) + 1 == 2077
    # DP attention: 78 attention AllReduces gone, 78 AllGathers + 78 ReduceScatters (the seed's 156)
    assert dp8.counts_by_group()["dp_comm"] == 156
    assert dp8.counts_by_group()["attention"] == 1092 - 78
    assert len(dp8) + 1 == 2077 - 78 + 156 == 2155
    # MTP: draft (2) + verify (the 2076-kernel target pass) + draft_extend (the MTP layer, 41)
    assert mtp.graph_starts == (2, 2078) and len(mtp) == 2119 and mtp.sampling_after_graph == 1
    assert mtp.layer_counts() == tp8.layer_counts()  # the verify pass is the target model
    # DeepSeek-V3.2: 61 layers, 3 dense, the indexer on every layer
    assert dsv32.counts_by_group() == {"attention": 14 * 61, "indexer": 7 * 61, "moe": 9 * 58,
                                       "deepep": 2 * 58, "dense_mlp": 9, "outside": 4}
    assert len(dsv32.layer_counts()) == 61


def test_gemm_shapes_follow_the_heads_each_rank_holds():
    def shapes(topology: str, op: str) -> set[tuple[str, str]]:
        names = {k.kernel.name for k in decode_schedule(32, topology=topology).kernels if k.op == op}
        return {tuple(name.split("(unsigned int)")[2:4]) for name in names}

    # TP8: 8 heads per rank; DP8: all 64 (q_b 2048 -> 64 x 256, o_proj reads 64 x 256)
    assert shapes("glm-5.3-tp8-ep8", "q_b_proj") == {("2048, ", "2048, ")}
    assert shapes(DP8, "q_b_proj") == {("16384, ", "2048, ")}
    assert shapes(DP8, "o_proj") == {("6144, ", "16384, ")}
    # DeepSeek-V3.2 at TP8: 16 heads x 192 from q_lora 1536; qkv_a 1536 + 576 from hidden 7168
    assert shapes(DSV32, "q_b_proj") == {("3072, ", "1536, ")}
    assert shapes(DSV32, "qkv_a_proj") == {("2112, ", "7168, ")}
    assert shapes(DSV32, "o_proj") == {("7168, ", "2048, ")}


def test_the_reference_topology_still_writes_the_bundled_sample_byte_for_byte(tmp_path):
    name = "glm5-graph-healthy.sqlite"
    generate(tmp_path / name, **{"steps": STEPS, "seed": SEED, "vacuum": True, **SAMPLE_KWARGS[name]})
    digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    assert digest == hashlib.sha256((SAMPLES / name).read_bytes()).hexdigest()


def test_generate_refuses_what_it_does_not_simulate(tmp_path):
    with pytest.raises(ValueError, match="unknown topology"):
        generate(tmp_path / "x.sqlite", topology="glm-5.3-tp16")
    with pytest.raises(ValueError, match="graph mode"):
        generate(tmp_path / "x.sqlite", topology=MTP, mode="eager")
    with pytest.raises(ValueError, match="needs a topology with MTP"):
        generate(tmp_path / "x.sqlite", faults=("missing_draft_replay",))


def test_synth_command_takes_a_topology(tmp_path):
    out = tmp_path / "mtp.sqlite"
    result = CliRunner().invoke(main, ["synth", str(out), "--topology", MTP, "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: {MTP}, graph mode, 2 decode steps, 2120 kernels per step")
    bad = CliRunner().invoke(main, ["synth", str(out), "--topology", MTP, "--mode", "eager"])
    assert bad.exit_code == 2 and "graph mode" in bad.output


# ---- hand-written ledgers against their samples ----------------------------------------------


def test_dp8_ledger_passes_its_healthy_sample(checked):
    result = checked(TOPOLOGY_SAMPLES[DP8][0], EXPECTATIONS / f"{DP8}.toml")
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert result.step_table.height == 4
    assert _per_step(result, "kernels") == {2155}
    assert _op_per_step(result, "dp_gather") == _op_per_step(result, "dp_reduce_scatter") == {78}
    assert _op_per_step(result, "allreduce") == {0}
    assert _op_per_step(result, "q_b_proj") == _op_per_step(result, "o_proj") == {78}


def test_dp8_ledger_names_the_broken_fusion(checked):
    result = checked(TOPOLOGY_SAMPLES[DP8][1], EXPECTATIONS / f"{DP8}.toml")
    assert result.verdict == "fail"
    anchor = next(f for f in result.findings if f.check == "anchor")
    assert (anchor.subject, anchor.observed, anchor.expected) == ("per_token_group_quant", "231", "75 (= moe_layers)")
    # one extra quant after each norm, each fault once at its place in the class's sequence
    assert {(f.source, f.layers, f.observed) for f in result.findings if f.check == "layer_sequence"} == {
        ("layers.classes.dense.sequence", "0-2", "+ per_token_group_quant"),
        ("layers.classes.dense.sequence", "1-2", "+ per_token_group_quant"),
        ("layers.classes.moe.sequence", "3-77", "+ per_token_group_quant")}
    assert len([f for f in result.findings if f.check == "layer_sequence"]) == 4


def test_mtp_ledger_passes_its_healthy_sample_with_three_replays_per_step(checked):
    result = checked(TOPOLOGY_SAMPLES[MTP][0], EXPECTATIONS / f"{MTP}.toml")
    assert result.verdict == "pass", [f.message for f in result.findings]
    # 4 decode iterations: the first window holds the draft model's eager extend over the
    # prompt (excluded as prefill), the last draft_extend ends the capture (incomplete)
    assert result.step_table.height == 3
    assert _per_step(result, "graph_launches") == {3}
    assert _per_step(result, "step_entry_gaps") == {2}  # step entry and verify wait on their launch
    assert _per_step(result, "kernels") == {2120}
    assert _op_per_step(result, "sampling") == {1}
    assert _op_per_step(result, "sparse_mla") == {79} and _op_per_step(result, "paged_mqa_logits") == {22}


def test_mtp_ledger_names_the_missing_draft_replay(checked):
    result = checked(TOPOLOGY_SAMPLES[MTP][1], EXPECTATIONS / f"{MTP}.toml")
    assert result.verdict == "fail"
    found = {(f.check, f.subject): (f.observed, f.expected) for f in result.findings}
    assert found == {("graph_launches", "graph_launches"): ("2", "3"),
                     ("anchor", "eagle_draft"): ("0", "2 (= draft_graph_kernels)")}


def test_deepseek_ledger_passes_its_healthy_sample(checked):
    result = checked(TOPOLOGY_SAMPLES[DSV32][0], EXPECTATIONS / f"{DSV32}.toml")
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert _per_step(result, "kernels") == {1932}
    assert _op_per_step(result, "fused_add_rmsnorm") == {122}
    assert _op_per_step(result, "sparse_mla") == _op_per_step(result, "paged_mqa_logits") == {61}
    assert _op_per_step(result, "deepep_dispatch") == {58}
    assert _op_per_step(result, "router_gemm") == {58}


def test_deepseek_ledger_names_layer_41(checked):
    result = checked(TOPOLOGY_SAMPLES[DSV32][1], EXPECTATIONS / f"{DSV32}.toml")
    assert result.verdict == "fail"
    [finding] = result.findings
    assert (finding.check, finding.subject, finding.layers) == ("layer_sequence", "elementwise_kernel", "41")
    assert finding.message.startswith("layer 41: + `elementwise_kernel` after `bmm` (after moe sequence entry 12 of 27)")


# ---- learn: the round trip ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """topology -> the ledger learned from its healthy sample with the hand ledger as base."""
    folder = tmp_path_factory.mktemp("learned")
    out: dict[str, Path] = {}
    for topology, (healthy, _faulted) in TOPOLOGY_SAMPLES.items():
        path = folder / f"{topology}.toml"
        ledger = learn([SAMPLES / healthy], LearnOptions(base=_ledger(topology)))
        path.write_text(write_expectations(ledger), encoding="utf-8")
        out[topology] = path
    return out


@pytest.mark.parametrize("topology", list(TOPOLOGY_SAMPLES))
def test_learned_ledger_passes_the_healthy_sample(learned, checked, topology):
    result = checked(TOPOLOGY_SAMPLES[topology][0], learned[topology])
    assert result.verdict == "pass", [f.message for f in result.findings]


@pytest.mark.parametrize("topology", list(TOPOLOGY_SAMPLES))
def test_learned_ledger_fails_the_fault_like_the_hand_written_one(learned, checked, topology):
    faulted = TOPOLOGY_SAMPLES[topology][1]
    hand = checked(faulted, EXPECTATIONS / f"{topology}.toml")
    from_healthy = checked(faulted, learned[topology])
    assert hand.verdict == from_healthy.verdict == "fail"
    hand_anchors, _ = failures(hand)
    learned_anchors, _ = failures(from_healthy)
    assert hand_anchors <= learned_anchors
    # the same layers named, whether by a group count or by an edit of the layer's sequence
    assert layers_named(from_healthy) == layers_named(hand)
    hand_checks = {f.check for f in hand.findings} - {"anchor", "layer", "layer_uniform", "layer_sequence"}
    assert hand_checks <= {f.check for f in from_healthy.findings}


def test_learned_ledgers_keep_the_topologies_figures(learned):
    dp8, mtp, dsv32 = (load_expectations(learned[t]) for t in (DP8, MTP, DSV32))
    dp8_anchors = {a.op: a.expected.low for a in dp8.anchors}
    assert (dp8_anchors["dp_gather"], dp8_anchors["dp_reduce_scatter"]) == (78, 78)
    assert (dp8.total.low, dp8.total.high) == (2155, 2155)
    assert mtp.graph_launches_per_step.low == mtp.graph_launches_per_step.high == 3
    assert (mtp.total.low, mtp.total.high) == (2120, 2120)
    assert (dsv32.total.low, dsv32.total.high) == (1932, 1932)
    assert {a.op: a.expected.low for a in dsv32.anchors}["paged_mqa_logits"] == 61


def test_ledger_learned_without_the_draft_replay_fails_the_healthy_mtp_sample(tmp_path):
    """The inverse: a ledger learned from the faulted capture holds its 2 launches per step."""
    faulted = SAMPLES / TOPOLOGY_SAMPLES[MTP][1]
    path = tmp_path / "without-draft.toml"
    path.write_text(write_expectations(learn([faulted], LearnOptions(base=_ledger(MTP)))), encoding="utf-8")
    result = nsys_ledger.check(SAMPLES / TOPOLOGY_SAMPLES[MTP][0], load_expectations(path))
    found = {(f.check, f.subject): (f.observed, f.expected) for f in result.findings}
    # one replay more than the ledger allows reads as a graph break
    assert found == {("graph_break", "graph_launches"): ("3", "2"), ("total", "kernels"): ("2120", "2118")}
