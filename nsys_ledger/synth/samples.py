"""Regenerate the bundled synthetic traces (sample_traces/).

    python -m nsys_ledger.synth.samples sample_traces/

Each file is a small (4 decode steps, < 5 MB) synthetic nsys 2026.2 export of SGLang GLM-5.3
decode (or, named by its `topology`, GLM-5.3 with DP attention or MTP, or DeepSeek-V3.2, or
vLLM V1 serving GLM-5.3 or DeepSeek-V3.2); `manifest.json` next to them records the generator's
truth for each file (kernels per step, per-name counts, injected gaps, H2D copies per step, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from nsys_ledger.synth.generate import generate

MAX_BYTES = 5_000_000
STEPS = 4
SEED = 0

SAMPLES: dict[str, dict] = {
    "glm5-graph-healthy.sqlite": {"mode": "graph"},
    "glm5-eager-healthy.sqlite": {"mode": "eager", "step_nvtx": True},
    "glm5-graph-broken-fusion.sqlite": {"faults": ("broken_fusion",)},
    "glm5-graph-chunked-indexer.sqlite": {"faults": ("chunked_indexer",)},
    "glm5-graph-extra-gaps.sqlite": {"faults": ("extra_gaps",)},
    "glm5-graph-extra-h2d.sqlite": {"faults": ("extra_h2d",)},
    "glm5-graph-split-graph.sqlite": {"faults": ("split_graph",)},
    "glm5-graph-layer41.sqlite": {"faults": ("layer_fault",)},
    "glm5-graph-pageable-h2d.sqlite": {"faults": ("pageable_h2d",)},
    # gaps whose cause the trace shows: a host sync before the replay, two late collectives,
    # a late sampling launch (the host falls behind, so the next step's copies are host bound)
    "glm5-graph-caused-gaps.sqlite": {"faults": ("extra_gaps_sync", "extra_gaps_collective",
                                                 "extra_gaps_host")},
    # a split decode graph whose second replay starts 5 us late on the device, long after its
    # launch returned: a gap at the graph boundary (no copy between the replays this time)
    "glm5-graph-boundary-gap.sqlite": {"faults": ("extra_gaps_graph",)},
    # two processes in one file: 3 steps keep it under the size budget
    "glm5-graph-2ranks-slow-rank1.sqlite": {"ranks": 2, "slow_rank": 1, "slow_factor": 1.2,
                                            "steps": 3},
    # layer attribution: three captured graphs (batch 32, 16, 8; decode replays 32) whose exec
    # nodes are two clone links away from the capture nodes ...
    "glm5-graph-multi-capture.sqlite": {"capture_batch_sizes": (8, 16, 32), "clone_links": 2},
    # ... and an eager trace without any layer-wise NVTX range: layers must be inferred
    "glm5-eager-no-nvtx.sqlite": {"mode": "eager", "layerwise_nvtx": False},
    # SGLang's default under CUDA graphs: no layer-wise NVTX at all, so layers and the ops of
    # shared names (o_proj's shape in the shared expert, tile-named cuBLAS GEMMs) come from each
    # layer's kernel sequence; healthy, one extra kernel in layer 41, layer 7's kv_a_layernorm gone
    "glm5-graph-no-nvtx-healthy.sqlite": {"layerwise_nvtx": False},
    "glm5-graph-no-nvtx-layer41.sqlite": {"layerwise_nvtx": False, "faults": ("layer_fault",)},
    "glm5-graph-no-nvtx-missing-kernel.sqlite": {"layerwise_nvtx": False, "faults": ("missing_kernel",)},
    # PyTorch profiler (Kineto) twins of four samples above: the same timeline (same kwargs and
    # seed), as SGLang's torch profile of the serving loop (synth/kineto_writer.py); checked
    # against their SQLite twins in tests/test_kineto_twins.py
    "glm5-graph-healthy.trace.json.gz": {"mode": "graph", "format": "kineto"},
    "glm5-eager-healthy.trace.json.gz": {"mode": "eager", "step_nvtx": True, "format": "kineto"},
    "glm5-graph-broken-fusion.trace.json.gz": {"faults": ("broken_fusion",), "format": "kineto"},
    "glm5-graph-extra-h2d.trace.json.gz": {"faults": ("extra_h2d",), "format": "kineto"},
    # other deployments (synth/topologies.py), each healthy and with one fault its ledger in
    # expectations/ must name: DP attention with the norm + quant fusion broken, ...
    "glm5-dp8-graph-healthy.sqlite": {"topology": "glm-5.3-dp8-ep8"},
    "glm5-dp8-graph-broken-fusion.sqlite": {"topology": "glm-5.3-dp8-ep8",
                                            "faults": ("broken_fusion",)},
    # ... MTP with the draft graph never replayed (2 graph launches per step instead of 3), ...
    "glm5-mtp-graph-healthy.sqlite": {"topology": "glm-5.3-tp8-ep8-mtp"},
    "glm5-mtp-graph-missing-draft.sqlite": {"topology": "glm-5.3-tp8-ep8-mtp",
                                            "faults": ("missing_draft_replay",)},
    # ... and DeepSeek-V3.2 with one extra kernel in layer 41
    "dsv32-graph-healthy.sqlite": {"topology": "deepseek-v3.2-tp8-ep8"},
    "dsv32-graph-layer41.sqlite": {"topology": "deepseek-v3.2-tp8-ep8", "faults": ("layer_fault",)},
    # vLLM V1 (synth/vllm.py): GLM-5.3 in a FULL decode graph with vLLM's step annotation, ...
    "glm5-vllm-graph-healthy.sqlite": {"topology": "glm-5.3-vllm-tp8-ep8", "step_nvtx": True},
    # ... in PIECEWISE graphs (100 replays per step, the attention and indexer ops eager between
    # them), without step ranges: steps come from the graph launches and the eager argmax ...
    "glm5-vllm-piecewise-healthy.sqlite": {"topology": "glm-5.3-vllm-tp8-ep8-piecewise"},
    # ... with torch.compile's RMSNorm + FP8 quant fusion broken (the unfused norm and a group
    # quant at each of the 159 fused sites) ...
    "glm5-vllm-graph-broken-fusion.sqlite": {"topology": "glm-5.3-vllm-tp8-ep8", "step_nvtx": True,
                                             "faults": ("broken_fusion",)},
    # ... the same broken fusion in PIECEWISE graphs (the fused sites are inside the pieces) ...
    "glm5-vllm-piecewise-broken-fusion.sqlite": {"topology": "glm-5.3-vllm-tp8-ep8-piecewise",
                                                 "faults": ("broken_fusion",)},
    # ... and DeepSeek-V3.2 in a FULL graph, healthy and with the fusion broken
    "dsv32-vllm-graph-healthy.sqlite": {"topology": "deepseek-v3.2-vllm-tp8-ep8", "step_nvtx": True},
    "dsv32-vllm-graph-broken-fusion.sqlite": {"topology": "deepseek-v3.2-vllm-tp8-ep8", "step_nvtx": True,
                                              "faults": ("broken_fusion",)},
}


def _manifest_entry(summary, kwargs: dict, size: int) -> dict:
    return {
        "generate_kwargs": {"steps": STEPS, "seed": SEED,
                            **{k: list(v) if isinstance(v, tuple) else v
                               for k, v in kwargs.items()}},
        "bytes": size,
        "mode": summary.mode,
        "ranks": summary.ranks,
        "faults": list(summary.faults),
        "kernels_per_step": summary.kernels_per_step,
        "graph_kernels_per_step": summary.graph_kernels_per_step,
        "graph_launches_per_step": summary.graph_launches_per_step,
        "h2d_per_step": summary.h2d_per_step,
        "pageable_h2d_per_step": summary.pageable_h2d_per_step,
        "step_group_counts": summary.step_group_counts,
        "step_short_counts": summary.step_short_counts,
        "step_kernel_counts": summary.step_kernel_counts,
        "injected_gaps": [
            {"rank": g.rank, "step": g.step, "layer": g.layer, "op": g.op,
             "planned_ns": g.planned_ns, "idle_start": g.idle_start, "idle_end": g.idle_end,
             "cause": g.cause}
            for g in summary.injected_gaps],
        "steps": [
            {"rank": t.rank, "index": t.index, "start": t.start, "end": t.end,
             "kernels": t.kernels, "h2d": t.h2d, "max_gap_ns": t.max_gap_ns,
             "gaps_over_2us": t.gaps_over_threshold, "entry_gap_ns": t.entry_gap_ns,
             "graph_launch_correlation_ids": list(t.graph_launch_correlation_ids)}
            for t in summary.step_truth],
        "pids": list(summary.pids),
        "step_layer_kernels": list(summary.step_layer_kernels),
        "step_outside_layer_kernels": summary.step_outside_layer_kernels,
        "captured_batch_sizes": list(summary.captured_batch_sizes),
        "clone_links": summary.clone_links,
    }


def build(outdir: str | Path, *, only: list[str] | None = None, verbose: bool = True) -> dict:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, dict] = {}
    mpath = out / "manifest.json"
    if only and mpath.exists():
        manifest = json.loads(mpath.read_text())
    for name, kwargs in SAMPLES.items():
        if only and name not in only:
            continue
        t = time.perf_counter()
        s = generate(out / name, **{"steps": STEPS, "seed": SEED, "vacuum": True, **kwargs})
        size = (out / name).stat().st_size
        if size >= MAX_BYTES:
            raise RuntimeError(f"{name} is {size} bytes, over the {MAX_BYTES} byte budget")
        manifest[name] = _manifest_entry(s, kwargs, size)
        if verbose:
            print(f"{name:42s} {size / 1e6:6.2f} MB  {s.kernels_per_step} kernels/step  "
                  f"{time.perf_counter() - t:5.2f} s")
    mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", nargs="?", default="sample_traces")
    ap.add_argument("--only", nargs="*", help="regenerate only these file names")
    args = ap.parse_args(argv)
    build(args.outdir, only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
