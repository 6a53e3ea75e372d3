"""Capture-time module and layer of replayed graph kernels, from PyTorch profiler capture traces.

A decode step replayed from a CUDA/HIP graph shows only `cudaGraphLaunch` on the host: the
Python modules, custom ops and layers that issued its kernels ran once, at capture. SGLang
(`--enable-profile-cuda-graph`, `capture_traces/bs_<bs>_rank<r>.json.gz`) and vLLM profile that
capture: between `*StreamBeginCapture` and `*StreamEndCapture` every launch call is recorded,
under the cpu ops, `nn.Module` ranges and annotations that were open then, and ROCm names the
launched kernel in `args.kernel`.

The replay trace's graph kernels (`graph_node_id`, given by the Kineto reader in replay order)
are paired with the capture's launches:

1. Each capture window (a Begin/End pair on one thread, in one capture file) is one graph. A
   replayed graph is paired with the window that shares the most (kernel name, occurrence)
   pairs with it; without kernel names (CUPTI does not record them), with the window of the
   same node count.
2. Inside the pair, the k-th replayed kernel of a name is the k-th captured launch of that name
   (launch order of each kernel; a stream's order is the order its kernels were launched, and
   the capture has one recording thread); without names, node position = launch position.
3. The ranges enclosing each captured launch on its thread give `module` (the innermost
   ``nn.Module: X_n`` below the whole-model wrappers), `layer` (the `n` of the innermost decoder-layer module:
   ``Qwen3DecoderLayer_12``, ``TransformerBlock_3``) and `op` (the innermost named custom op that
   is not an ATen op: ``sglang_profiler::rmsnorm_...``, ``vllm::unified_attention``).

`attach_captures` also returns the replay Trace with the capture's origin written the way an
nsys export records it: one `graph_nodes` row per replayed node (created on a capture thread
at the launch's time) and the capture-time ranges on that thread (domain ``capture:<cat>``),
so `attribution.layers` attributes them through its `capture_nvtx` path like any other.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from nsys_ledger.attribution.nvtx_projection import enclosing_ranges, projectable_ranges
from nsys_ledger.errors import TraceError
from nsys_ledger.trace.kineto_reader import CAPTURE_HINT, GRAPH_ID_SHIFT, KINETO_VERSION_SOURCE, load_kineto_capture
from nsys_ledger.trace.model import Trace

I64 = pl.Int64
# Capture-time ranges are put on threads of the replay process that no OS gives out: the
# highest 24-bit thread ids, one per capture file, counting down.
CAPTURE_TID_BASE = 0xFFFFFF
_PID_SHIFT = 1 << 24
EC_NODE_CREATION = 77  # the eventClass nsys gives graph node creation rows

LAYER_MODULE_REGEX = r"^nn\.Module: \w*?(?:DecoderLayer|TransformerBlock|TransformerLayer|Block|Layer)_(\d+)$"
# Modules that wrap the whole model say nothing about where a kernel belongs: the compiled FX
# graph of vLLM (`GraphModule_0`, the decoder layers are inlined into it), `Qwen3ForCausalLM_0`,
# `Qwen3Model_0`.
WHOLE_MODEL_MODULE_REGEX = r"^nn\.Module: (?:GraphModule|\w*ForCausalLM|\w*Model)_\d+$"
NAMED_OP_REGEX = r"^(?:[A-Za-z_]\w*::)+\w+"  # `ns::op`, not an ATen op (filtered apart)
CAPTURED_KINDS = ("kernel_launch", "memcpy", "memset")

NODE_SCHEMA = {
    "pid": I64, "graph_id": I64, "graph_node_id": I64, "name": pl.Utf8, "kernels": I64,
    "capture_file": pl.Utf8, "capture_window": I64, "capture_tid": I64, "capture_start": I64, "capture_end": I64,
    "module": pl.Utf8, "layer": I64, "op": pl.Utf8,
}


@dataclass(frozen=True)
class CaptureAttribution:
    trace: Trace  # the replay trace + graph node rows and capture-time ranges
    nodes: pl.DataFrame  # one row per replayed graph node (NODE_SCHEMA); `kernels`: its rows in the trace
    graphs: pl.DataFrame  # pid, graph_id, nodes, capture_file, capture_window, matched (nodes paired)

    def coverage(self) -> dict[str, int]:
        """Replayed graph kernels (every replay's rows) in all, paired with a launch, with a
        module, with a layer, with a named op, and with a module or a layer."""
        kernels = self.nodes.filter(pl.col("name").is_not_null())
        weight = pl.col("kernels")

        def total(condition: pl.Expr) -> int:
            return int(kernels.filter(condition).select(weight.sum()).item() or 0)

        return {
            "replayed_kernels": total(pl.lit(True)),
            "paired": total(pl.col("capture_start").is_not_null()),
            "module": total(pl.col("module").is_not_null()),
            "layer": total(pl.col("layer").is_not_null()),
            "op": total(pl.col("op").is_not_null()),
            "module_or_layer": total(pl.col("module").is_not_null() | pl.col("layer").is_not_null()),
        }

    def notice(self) -> str:
        c = self.coverage()
        n = c["replayed_kernels"] or 1
        return (
            f"capture traces: {c['paired']} of {c['replayed_kernels']} replayed graph kernels paired with their "
            f"capture-time launch; {c['module_or_layer'] / n:.1%} have a module or layer ({c['layer'] / n:.1%} a "
            f"layer, {c['op'] / n:.1%} a named op)"
        )


def capture_files(paths: list[str | os.PathLike[str]]) -> list[Path]:
    """The capture traces named: files, or the `*.json` / `*.json.gz` files of directories."""
    files: list[Path] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and q.name.lower().endswith((".json", ".json.gz")))
            if not found:
                raise TraceError(str(given), "is a directory without capture traces (*.json, *.json.gz)")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise TraceError(str(given), "no such file")
    return files


def attach_captures(trace: Trace, paths: list[str | os.PathLike[str]]) -> CaptureAttribution:
    """Pair the graph kernels of `trace` with the launches recorded in the capture traces."""
    if trace.meta.version_source != KINETO_VERSION_SOURCE:
        raise TraceError(trace.path, "--capture pairs a PyTorch profiler trace with its capture traces; an nsys "
                                     "export records where its graph nodes were captured itself")
    launches, ranges = [], []
    for index, path in enumerate(capture_files(paths)):
        capture, launch_kernels = load_kineto_capture(path)
        if capture.meta.version_source != KINETO_VERSION_SOURCE:
            raise TraceError(str(path), "a capture trace must be a PyTorch profiler trace")
        found = captured_launches(capture, launch_kernels).with_columns(pl.lit(str(path)).alias("capture_file"))
        launches.append(found.with_columns(pl.lit(index, I64).alias("_file")))
        ranges.append(projectable_ranges(capture.nvtx).with_columns(pl.lit(index, I64).alias("_file")))
    all_launches = pl.concat(launches) if launches else _empty_launches()
    nodes = replay_nodes(trace)
    graphs = pair_graphs(nodes, all_launches)
    paired = pair_nodes(nodes, graphs, all_launches)
    origins = launch_origins(paired, ranges)
    merged = with_capture_origins(trace, origins, ranges)
    hint_start = CAPTURE_HINT.split("{kernels}")[1][:40]
    merged = dataclasses.replace(merged, meta=dataclasses.replace(
        merged.meta, warnings=tuple(w for w in merged.meta.warnings if hint_start not in w)))
    return CaptureAttribution(trace=merged, nodes=origins.select(list(NODE_SCHEMA)), graphs=graphs)


# ---- the capture side -------------------------------------------------------------------


def _empty_launches() -> pl.DataFrame:
    return pl.DataFrame(schema={
        "global_tid": I64, "window": I64, "position": I64, "start": I64, "end": I64, "kernel": pl.Utf8,
        "occurrence": I64, "capture_file": pl.Utf8, "_file": I64,
    })


def captured_launches(capture: Trace, launch_kernels: pl.DataFrame) -> pl.DataFrame:
    """Launch-like calls inside a Begin/EndCapture pair of their thread: `global_tid, window,
    position, start, end, kernel, occurrence` (k-th launch of that kernel name in the window)."""
    calls = capture.api_calls
    begins = calls.filter(pl.col("name").str.contains(r"StreamBeginCapture")).select(
        "global_tid", pl.col("start").alias("begin"))
    ends = calls.filter(pl.col("name").str.contains(r"StreamEndCapture")).select(
        "global_tid", pl.col("start").alias("finish"))
    windows = (
        begins.sort("global_tid", "begin")
        .join_asof(ends.sort("global_tid", "finish"), left_on="begin", right_on="finish", by="global_tid",
                   strategy="forward", check_sortedness=False)
        .with_columns(pl.int_range(pl.len()).cast(I64).alias("window"))
    )
    launches = (
        calls.filter(pl.col("kind").is_in(CAPTURED_KINDS))
        .join(launch_kernels, on=["pid", "correlation"], how="left")
        .select("global_tid", "start", "end", "kernel")
        .sort("global_tid", "start")
    )
    if windows.height == 0 or launches.height == 0:
        return _empty_launches().drop("capture_file", "_file")
    inside = launches.join_asof(
        windows.select("global_tid", "begin", "finish", "window"), left_on="start", right_on="begin",
        by="global_tid", strategy="backward", check_sortedness=False,
    ).filter(pl.col("window").is_not_null() & (pl.col("finish").is_null() | (pl.col("start") <= pl.col("finish"))))
    return inside.sort("window", "start").with_columns(
        pl.int_range(pl.len()).over("window").cast(I64).alias("position"),
        pl.int_range(pl.len()).over("window", "kernel").cast(I64).alias("occurrence"),
    ).select("global_tid", "window", "position", "start", "end", "kernel", "occurrence")


# ---- the replay side --------------------------------------------------------------------


def replay_nodes(trace: Trace) -> pl.DataFrame:
    """One row per graph node of the replay: `pid, graph_id, graph_node_id, position, name,
    occurrence, kernels` (`name` null for copy and memset nodes, `kernels` its replayed rows)."""
    kernels = trace.kernels.filter(pl.col("graph_node_id").is_not_null())
    copies = pl.concat([
        frame.filter(pl.col("graph_node_id").is_not_null()).select("pid", "graph_node_id")
        for frame in (trace.memcpys, trace.memsets)
    ])
    nodes = pl.concat([
        kernels.select("pid", "graph_node_id", "name"),
        copies.with_columns(pl.lit(None, pl.Utf8).alias("name")),
    ])
    return (
        nodes.group_by("pid", "graph_node_id")
        .agg(pl.col("name").first(), pl.len().cast(I64).alias("kernels"))
        .with_columns(
            (pl.col("graph_node_id") // (1 << GRAPH_ID_SHIFT)).alias("graph_id"),
            (pl.col("graph_node_id") % (1 << GRAPH_ID_SHIFT)).alias("position"),
        )
        .sort("pid", "graph_node_id")
        .with_columns(pl.int_range(pl.len()).over("pid", "graph_id", "name").cast(I64).alias("occurrence"))
    )


def pair_graphs(nodes: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Each replayed graph and the capture window it came from (by shared kernel names and
    occurrences, else by equal node count): `pid, graph_id, nodes, capture_file, capture_window`."""
    sizes = nodes.group_by("pid", "graph_id").agg(pl.len().cast(I64).alias("nodes"))
    if launches.height == 0:
        return sizes.with_columns(pl.lit(None, I64).alias("_file"), pl.lit(None, pl.Utf8).alias("capture_file"),
                                  pl.lit(None, I64).alias("capture_window"))
    windows = launches.group_by("_file", "capture_file", "window").agg(
        pl.len().cast(I64).alias("_launches"), pl.col("kernel").is_not_null().sum().alias("_named"))
    shared = (
        nodes.filter(pl.col("name").is_not_null())
        .join(launches.filter(pl.col("kernel").is_not_null()),
              left_on=["name", "occurrence"], right_on=["kernel", "occurrence"])
        .group_by("pid", "graph_id", "_file", "capture_file", "window").agg(pl.len().alias("_shared"))
    )
    by_count = sizes.join(windows.filter(pl.col("_named") == 0), left_on="nodes", right_on="_launches").with_columns(
        pl.lit(0, pl.UInt32).alias("_shared"))
    candidates = pl.concat([
        shared,
        by_count.select("pid", "graph_id", "_file", "capture_file", "window", "_shared"),
    ])
    best = (
        candidates.sort(["pid", "graph_id", "_shared", "_file", "window"],
                        descending=[False, False, True, False, False])
        .unique(subset=["pid", "graph_id"], keep="first", maintain_order=True)
        .select("pid", "graph_id", "_file", "capture_file", pl.col("window").alias("capture_window"))
    )
    return sizes.join(best, on=["pid", "graph_id"], how="left").sort("pid", "graph_id")


def pair_nodes(nodes: pl.DataFrame, graphs: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """`nodes` + the paired launch's `capture_file, capture_window, capture_tid, capture_start,
    capture_end, _file` (null where none)."""
    with_window = nodes.join(graphs.select("pid", "graph_id", "_file", "capture_file", "capture_window"),
                             on=["pid", "graph_id"], how="left")
    launch_cols = launches.select(
        "_file", pl.col("window").alias("capture_window"), "position", "kernel", "occurrence",
        pl.col("global_tid").alias("capture_tid"), pl.col("start").alias("capture_start"),
        pl.col("end").alias("capture_end"),
    )
    named_windows = launches.group_by("_file", "window").agg(pl.col("kernel").is_not_null().any().alias("_named"))
    with_window = with_window.join(named_windows.rename({"window": "capture_window"}),
                                   on=["_file", "capture_window"], how="left")
    by_name = with_window.filter(pl.col("_named").fill_null(False)).join(
        launch_cols.drop("position"), left_on=["_file", "capture_window", "name", "occurrence"],
        right_on=["_file", "capture_window", "kernel", "occurrence"], how="left")
    by_position = with_window.filter(~pl.col("_named").fill_null(False)).join(
        launch_cols.drop("kernel", "occurrence"), on=["_file", "capture_window", "position"], how="left")
    return pl.concat([by_name, by_position], how="diagonal_relaxed").sort("pid", "graph_node_id")


def launch_origins(paired: pl.DataFrame, ranges: list[pl.DataFrame]) -> pl.DataFrame:
    """`paired` + `module, layer, op` from the ranges enclosing each paired launch."""
    calls = paired.with_row_index("call").with_columns(pl.col("call").cast(I64))
    found = []
    for index, file_ranges in enumerate(ranges):
        probes = calls.filter((pl.col("_file") == index) & pl.col("capture_start").is_not_null())
        if probes.height and file_ranges.height:
            found.append(enclosing_ranges(probes, file_ranges.drop("_file"), thread_col="capture_tid",
                                          start_col="capture_start", end_col="capture_end"))
    enclosing = pl.concat(found) if found else pl.DataFrame(schema={"call": I64, "nesting": I64, "name": pl.Utf8,
                                                                     "domain": pl.Utf8})

    def innermost(condition: pl.Expr, value: pl.Expr, alias: str) -> pl.DataFrame:
        return (
            enclosing.filter(condition).sort("call", "nesting").unique(subset=["call"], keep="first")
            .select("call", value.alias(alias))
        )

    module = innermost(
        (pl.col("domain") == "nn.Module") & ~pl.col("name").str.contains(WHOLE_MODEL_MODULE_REGEX),
        pl.col("name").str.strip_prefix("nn.Module: "), "module",
    )
    layer = innermost(pl.col("name").str.contains(LAYER_MODULE_REGEX),
                      pl.col("name").str.extract(LAYER_MODULE_REGEX, 1).cast(I64), "layer")
    op = innermost(
        pl.col("domain").is_in(["cpu_op", "user_annotation"]) & pl.col("name").str.contains(NAMED_OP_REGEX)
        & ~pl.col("name").str.starts_with("aten::"),
        pl.col("name"), "op",
    )
    return (
        calls.join(module, on="call", how="left").join(layer, on="call", how="left").join(op, on="call", how="left")
        .drop("call")
    )


# ---- the merged Trace -------------------------------------------------------------------


def with_capture_origins(trace: Trace, origins: pl.DataFrame, ranges: list[pl.DataFrame]) -> Trace:
    """`trace` + a graph node row per paired node, created on a capture thread of its process
    at its launch's time, and the capture-time ranges on that thread."""
    paired = origins.filter(pl.col("capture_start").is_not_null())
    if paired.height == 0:
        return trace
    thread = (pl.col("pid") * _PID_SHIFT + (CAPTURE_TID_BASE - pl.col("_file"))).alias("global_tid")
    node_rows = paired.select(
        pl.col("capture_start").alias("start"), pl.col("capture_end").alias("end"), thread, "pid",
        (CAPTURE_TID_BASE - pl.col("_file")).alias("tid"),
        pl.lit(EC_NODE_CREATION, I64).alias("event_class"), pl.lit("captured launch").alias("name"),
        "graph_node_id", pl.lit(None, I64).alias("original_graph_node_id"),
    )
    # the capture threads of each file become one capture thread of each process that replayed it
    users = paired.select("pid", "_file", "capture_tid").unique()
    range_rows = []
    for index, file_ranges in enumerate(ranges):
        used = users.filter(pl.col("_file") == index)
        if used.height == 0 or file_ranges.height == 0:
            continue
        moved = file_ranges.join(used.rename({"capture_tid": "global_tid"}), on="global_tid")
        range_rows.append(moved.select(
            "start", pl.col("end").alias("end"), thread, "pid", (CAPTURE_TID_BASE - pl.col("_file")).alias("tid"),
            pl.lit(None, I64).alias("end_global_tid"), pl.lit(59, I64).alias("event_type"), "name",
            pl.concat_str(pl.lit("capture:"), pl.col("domain").fill_null("")).alias("domain"),
        ))
    graph_nodes = pl.concat([trace.graph_nodes, node_rows.select(trace.graph_nodes.columns)], how="vertical_relaxed")
    nvtx = trace.nvtx
    if range_rows:
        nvtx = pl.concat([nvtx, pl.concat(range_rows).select(nvtx.columns)], how="vertical_relaxed")
    return dataclasses.replace(trace, graph_nodes=graph_nodes.cast(trace.graph_nodes.schema),
                               nvtx=nvtx.cast(trace.nvtx.schema))
