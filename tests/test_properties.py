"""Property tests: for random generator settings and fault sets, the checker reports exactly
the injected faults and the true per-step counts of the generator's summary.

The generator and the checker are independent (synth/ never imports checks/; the ledger is the
expectations file), so agreement on random inputs is evidence, not a tautology. Examples are
few and small (1-3 steps, 1-2 ranks) to keep `make test` short, and derandomized so that CI
sees the same ones; NSYS_LEDGER_PROPERTY_EXAMPLES=200 explores with fresh random examples.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsys_ledger import check
from nsys_ledger.synth import generate

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

# fault -> (findings it must cause, findings it may cause as well), by the expectation line a
# finding names. split_graph adds an H2D copy between its two replays; a pageable copy blocks
# the host, which can leave the GPU idle; extra kernels also break the per-layer sequences
# (and the groups of layers whose class declares none), and 156 extra quants the total.
FAULT_FINDINGS: dict[str, tuple[set[str], set[str]]] = {
    "broken_fusion": ({"anchors.per_token_group_quant"},
                      {"layers.classes.dense.sequence", "layers.classes.moe.sequence", "total"}),
    "chunked_indexer": ({"anchors.paged_mqa_logits"}, {"layers.classes.full_indexer.groups.indexer"}),
    "extra_h2d": ({"h2d"}, set()),
    "split_graph": ({"graphs.launches_per_step", "h2d"}, set()),
    "pageable_h2d": ({"h2d.pageable_allowed"}, set()),
    "extra_gaps": ({"gaps.threshold_us"}, set()),
}
GAPS = "gaps.threshold_us"
EXAMPLES = int(os.environ.get("NSYS_LEDGER_PROPERTY_EXAMPLES", "8"))


def _true_ops(summary) -> dict[str, int]:
    """Per-step kernels of three anchor ops, from the generator's per-name truth."""
    counts = summary.step_kernel_counts
    return {
        "fused_add_rmsnorm": sum(n for name, n in counts.items() if "FusedAddRMSNormKernel" in name),
        "paged_mqa_logits": sum(n for name, n in counts.items() if "paged_mqa_logits<" in name),
        "per_token_group_quant": sum(n for name, n in counts.items() if "per_token_group_quant" in name),
    }


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 20, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.integers(1, 3),
    ranks=st.integers(1, 2),
    batch=st.sampled_from([8, 16, 32, 64]),
    seed=st.integers(0, 2**16),
    faults=st.sets(st.sampled_from(sorted(FAULT_FINDINGS))),
)
def test_checker_finds_exactly_the_injected_faults(steps, ranks, batch, seed, faults):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.sqlite"
        summary = generate(path, mode="graph", steps=steps, ranks=ranks, batch=batch, seed=seed,
                           faults=tuple(sorted(faults)))
        result = check(path, GLM)

    # the true counts, step by step
    table = result.step_table.sort("rank", "step")
    assert table.height == steps * ranks
    assert set(table["kernels"]) == {summary.kernels_per_step}
    assert set(table["graph_launches"]) == {summary.graph_launches_per_step}
    assert set(table["h2d"]) == {summary.h2d_per_step}
    assert set(table["h2d_pageable"]) == {summary.pageable_h2d_per_step}
    ops = result.op_table.sort("rank", "step")
    for op, count in _true_ops(summary).items():
        assert set(ops[op]) == {count}, op
    truth_gaps = sorted((s.rank, s.index, s.gaps_over_threshold) for s in summary.step_truth)
    assert table.select("rank", "step", "gaps").rows() == truth_gaps
    assert len(summary.injected_gaps) == (3 * steps * ranks if "extra_gaps" in faults else 0)

    # exactly the injected faults (and the idle gaps the truth says are there)
    must, may = set(), set()
    for fault in faults:
        must |= FAULT_FINDINGS[fault][0]
        may |= FAULT_FINDINGS[fault][1]
    if any(s.gaps_over_threshold for s in summary.step_truth):
        must.add(GAPS)
    found = {f.source for f in result.findings}
    assert must <= found <= must | may, (sorted(found), sorted(must), sorted(may))
    assert result.verdict == ("fail" if must else "pass")
