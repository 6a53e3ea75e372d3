"""Generate a synthetic nsys 2026 SQLite export of SGLang GLM-5.3 decode from the reference
schedule.

    >>> from nsys_ledger.synth import generate
    >>> s = generate("/tmp/glm5.sqlite", mode="graph", steps=8, faults=("extra_gaps",))
    >>> s.kernels_per_step, s.graph_launches_per_step, len(s.injected_gaps)
    (2002, 1, 24)

Timeline of one rank (one process, one GPU; ranks share nothing but timing: collective kernels
end together on every rank, so a slow rank makes its peers wait inside their collectives):

graph mode (`--cuda-graph-trace=node`)
    startup API calls -> warm-up decode forward (eager, alt streams, layerwise NVTX) ->
    cudaDeviceSynchronize -> capture: cudaStreamBeginCapture, one launch call per kernel under
    the layerwise NVTX ranges (no kernel rows: capture does not execute; one
    CUDA_GRAPH_NODE_EVENTS row per node, eventClass 77, inside the launch call),
    cudaStreamEndCapture, cudaGraphInstantiateWithFlags (cloned exec nodes whose
    originalGraphNodeId is the capture node; CUDA_GRAPH_EVENTS 95 inside BeginCapture and
    94 inside the instantiate call) -> prefill forward (eager) + sampling ->
    decode steps: 3 pinned H2D cudaMemcpyAsync, ONE cudaGraphLaunch (all its kernel rows share
    its correlationId and carry the exec node ids and the graph id), the sampling kernel
    launched eagerly, cudaEventRecord, cudaEventSynchronize on the previous step.
    Step entry: the GPU runs the small copies in 1-2 µs and then waits for the launch: the
    cudaGraphLaunch call (several µs for ~2000 nodes) returns after the copies ended, and the
    first node starts 3-8 µs after the last copy (STEP_ENTRY_GAP_NS, fixed per step by the
    seed; StepTruth.entry_gap_ns). Inside the replay nodes follow each other within 0.5-1 µs.
    SGLang captures its graphs at start-up, before it serves any request, so the capture comes
    before the prefill here. With `capture_batch_sizes` one graph is captured per batch size,
    largest first (each under its own layer-wise NVTX ranges, whose inputs carry that size),
    and decode replays the one of `batch`; with `clone_links` > 1 each exec node is a clone of
    a clone of ... the capture node. The scheduler overlaps CPU and GPU (it issues step k+1
    while the GPU runs step k and only then waits for step k), so inside a replay the host is
    ahead and a healthy step has no device idle gap above the 0.5-1 µs node-to-node gap
    except its step entry (below). (The first
    decode step queues behind the prefill; with prefill=False it starts on an idle GPU and
    its first copies are host bound.)
eager mode
    startup -> prefill -> decode steps; every kernel has its own launch call (5-10 µs of host
    time each, plus tens of µs per module for the layerwise NVTX marker hooks), all on the
    main stream (SGLang only forks to the alt stream in capture mode), and the scheduler
    waits for each pass before the next, so the GPU waits on the host: host bound, many
    small gaps.

This module is the timeline: what runs when, on which stream, launched by which call, as
format-free records (GPU activities, API calls, NVTX ranges, syncs, graph events). The nsys
SQLite format of those records (StringIds, global ids, the tables of each nsys release) is
synth/nsys_sqlite.py; another format (a Kineto trace) can be written from the same records.

All timestamps are integer ns. Everything is deterministic for a given seed. The timeline is
the same in every export layout; the newest (2026.2) writes the activity tables' rows in
buffer-interleaved order rather than by start, as nsys 2025.6+ may (readers must sort).
DeepGEMM kernels are named in the layout of `deepgemm_layout` (synth/deepgemm.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from nsys_ledger.synth import schedule as S
from nsys_ledger.synth.nsys_schema import ERA_2026_2, SchemaEra
from nsys_ledger.synth.kineto_writer import KinetoTraceExport
from nsys_ledger.synth.nsys_sqlite import CaptureFacts, NsysSqliteExport
from nsys_ledger.synth.schema_eras import era_for_version
from nsys_ledger.synth.topologies import DEFAULT_TOPOLOGY, get_topology
from nsys_ledger.synth.vllm import VLLM_DEEPGEMM_LAYOUT, VLLM_FAULTS

FAULTS = ("broken_fusion", "chunked_indexer", "extra_gaps", "extra_h2d", "split_graph",
          "layer_fault", "pageable_h2d", "extra_gaps_host", "extra_gaps_sync",
          "extra_gaps_collective", "extra_gaps_graph", "missing_kernel")

# "extra_gaps": (layer, op, extra idle ns) injected before that kernel in every decode step.
# o_proj is on the main stream after the attention join, when the alt stream is idle, so the
# delay is a device idle gap on every stream. Nothing in the trace explains it (a device-side
# delay): its cause is "unknown".
GAP_SITES: tuple[tuple[int, str, int], ...] = ((12, "o_proj", 6_500), (40, "o_proj", 17_000),
                                               (68, "o_proj", 36_000))
# Variants of extra_gaps whose cause the trace shows, one kind per fault, in every decode step:
# "extra_gaps_collective": these collectives start late on the device although their launch
#   was early (they wait for something outside the process: their peers). Both follow main
#   stream work after the alt stream has joined, so the delay idles the whole device.
COLLECTIVE_GAP_SITES: tuple[tuple[int, str, int], ...] = ((20, "attn_allreduce", 9_000),
                                                          (50, "deepep.dispatch", 14_000))
# "extra_gaps_host": the host prepares the sampling metadata only after the graph replay has
#   finished, this long, then launches the sampling kernel: the GPU waits for the CPU.
HOST_GAP_NS = 12_000
# "extra_gaps_sync": after issuing the step's H2D copies the host calls cudaStreamSynchronize
#   (reading a value back, as `.item()` does), works this long, then launches the graph.
SYNC_GAP_HOST_NS = 4_000
# "extra_gaps_graph": the decode graph is split in two (as "split_graph", but with no copy
#   between the replays) and the second replay starts this late on the device although its
#   launch returned long before: the device's latency between two graph launches.
GRAPH_GAP_NS = 5_000
SPLIT_FAULTS = frozenset({"split_graph", "extra_gaps_graph"})  # faults that capture two graphs
# faults that only a topology with MTP knows (kept apart from FAULTS, the reference schedule's)
TOPOLOGY_FAULTS = ("missing_draft_replay",)
GAP_THRESHOLD_NS = 2_000
# Step entry in graph mode: the GPU finishes the step's small pinned H2D copies in 1-2 µs and
# then waits for cudaGraphLaunch, whose host call (submitting a ~2000-node graph) returns only
# after the GPU went idle. The first replayed kernel starts this long after the last copy ended
# (a per-step value drawn from the seed), about LAUNCH_TO_KERNEL_NS after the call returned.
STEP_ENTRY_GAP_NS = (3_000, 8_000)
LAUNCH_TO_KERNEL_NS = (300, 900)
# host time of one cudaGraphLaunch: a fixed part plus the node submission (~7.5 µs for 2001 nodes)
GRAPH_LAUNCH_BASE_NS = 2_500
GRAPH_LAUNCH_PER_NODE_NS = 2.5

PID_BASE = 2841
T0 = 41_203_517_112  # session start on the trace clock
STREAM_NULL, STREAM_POOL, STREAM_MAIN, STREAM_ALT = 7, 13, 20, 24

API_MEMCPY = "cudaMemcpyAsync_v3020"
API_GRAPH_LAUNCH = "cudaGraphLaunch_v10000"
API_BEGIN_CAPTURE = "cudaStreamBeginCapture_v10000"
API_END_CAPTURE = "cudaStreamEndCapture_v10000"
API_INSTANTIATE = "cudaGraphInstantiateWithFlags_v11040"
API_EVENT_RECORD = "cudaEventRecord_v3020"
API_WAIT_EVENT = "cudaStreamWaitEvent_v3020"
API_EVENT_SYNC = "cudaEventSynchronize_v3020"
API_DEVICE_SYNC = "cudaDeviceSynchronize_v3020"
API_STREAM_SYNC = "cudaStreamSynchronize_v3020"
# 2021 exports hold the launches as driver calls (eventClass 1; driver names carry no suffix)
API_DRIVER_LAUNCH = "cuLaunchKernel"
API_DRIVER_GRAPH_LAUNCH = "cuGraphLaunch"
# CUDA streams of every rank: (streamId, priority, flag), as TARGET_INFO_CUDA_STREAM lists them
STREAMS = ((STREAM_NULL, 0, 3), (STREAM_POOL, 0, 1), (STREAM_MAIN, 0, 2), (STREAM_ALT, 0, 2),
           (28, 4294967295, 2), (32, 4294967295, 2))


# ------------------------------------------------------------------------------------------------
# Truth handed back to the caller (tests use it as ground truth)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyTruth:
    label: str
    bytes: int
    pageable: bool


@dataclass(frozen=True)
class InjectedGap:
    rank: int
    step: int
    layer: int | None  # None outside the layers (the sampling kernel, the embedding)
    op: str
    kernel: str  # demangled name of the kernel the gap precedes
    # delay injected: on the device (unknown, collective), on the host after the device ran
    # dry (host); 0 for sync (the host waits in the sync, then works SYNC_GAP_HOST_NS)
    planned_ns: int
    idle_start: int  # device idle interval (all streams) that results
    idle_end: int
    cause: str = "unknown"  # what the trace shows as its reason: unknown, host, sync, collective

    @property
    def idle_ns(self) -> int:
        return self.idle_end - self.idle_start


@dataclass(frozen=True)
class StepTruth:
    rank: int
    index: int
    start: int  # start of the first H2D copy of the step
    end: int  # end of the sampling kernel
    kernels: int
    h2d: int
    graph_launch_correlation_ids: tuple[int, ...]
    sampling_correlation_id: int
    max_gap_ns: int  # largest device idle gap (all streams merged) inside [start, end]
    # gaps > GAP_THRESHOLD_NS inside [start, end], except the planned step-entry launch gap (the
    # price of the launch, not a fault); a longer entry gap (the host arrived late) counts
    gaps_over_threshold: int
    # graph mode: device idle time from the end of the step's last H2D copy before its first
    # replay to that replay's first kernel (the launch latency; STEP_ENTRY_GAP_NS when the host
    # was on time). None in eager mode.
    entry_gap_ns: int | None = None
    # largest device idle gap from the first replayed kernel to the end of the step (the
    # sampling kernel): what a healthy graph step keeps under GAP_THRESHOLD_NS
    max_gap_after_entry_ns: int = 0


@dataclass
class GenerateSummary:
    path: str
    mode: str
    steps: int
    ranks: int
    batch: int
    seed: int
    faults: tuple[str, ...]
    cuda_graph_trace: str
    kernels_per_step: int  # GPU kernel executions per decode step (graph kernels + sampling)
    graph_kernels_per_step: int  # of which inside CUDA graphs (0 in eager mode)
    step_kernel_counts: dict[str, int]  # demangled name -> executions per decode step
    step_short_counts: dict[str, int]  # shortName -> executions per decode step
    step_group_counts: dict[str, int]  # ledger group -> executions per decode step
    graph_launches_per_step: int
    h2d_per_step: int
    pageable_h2d_per_step: int
    copies_per_step: tuple[CopyTruth, ...]
    launch_calls_per_step: int  # kernel launch API calls per decode step
    prefill_kernels: int
    warmup_kernels: int
    capture_nodes: int  # capture-time graph nodes per rank (all graphs)
    injected_gaps: list[InjectedGap]
    step_truth: list[StepTruth]
    pids: tuple[int, ...]
    devices: tuple[int, ...]
    main_stream: int
    alt_stream: int
    slow_rank: int | None
    slow_factor: float
    rows: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # kernels per decode step in each decoder layer (index = layer), and outside the layers
    # (embedding, final norm, LM head, sampling): the truth for layer attribution
    step_layer_kernels: tuple[int, ...] = ()
    step_outside_layer_kernels: int = 0
    captured_batch_sizes: tuple[int, ...] = ()  # graph mode: one captured graph per size
    clone_links: int = 1  # graph mode: links from an exec node back to its capture node
    deepgemm_layout: str = S.DEFAULT_DEEPGEMM_LAYOUT  # how the DeepGEMM kernels are named
    schema_era: str = ERA_2026_2.name  # the nsys export layout written
    # graph mode: StepTruth.entry_gap_ns of every decode step, in step_truth order
    step_entry_gaps_ns: tuple[int, ...] = ()
    topology: str = DEFAULT_TOPOLOGY  # the deployment simulated (synth/topologies.py)

    def steps_of(self, rank: int = 0) -> list[StepTruth]:
        return [s for s in self.step_truth if s.rank == rank]

    def describe(self) -> str:
        """One line for a terminal (after the file name): mode, steps, kernels per step, the
        step-entry launch gap, faults, DeepGEMM and export layouts."""
        ranks = f" x {self.ranks} ranks" if self.ranks > 1 else ""
        per_step = f"{self.kernels_per_step} kernels per step"
        eager = self.kernels_per_step - self.graph_kernels_per_step - 1
        if self.graph_kernels_per_step and eager > 0:  # vLLM: eager launches around the graphs
            per_step += (f" ({self.graph_kernels_per_step} replayed in {self.graph_launches_per_step} "
                         f"graph launches, {eager} eager + sampling)")
        elif self.graph_kernels_per_step:
            per_step += f" ({self.graph_kernels_per_step} replayed + sampling)"
        entry = ""
        if self.step_entry_gaps_ns:
            lo, hi = min(self.step_entry_gaps_ns), max(self.step_entry_gaps_ns)
            entry = f", step-entry launch gap {lo / 1000:.1f}-{hi / 1000:.1f} us"
        faults = ", ".join(self.faults) if self.faults else "none"
        deployment = "" if self.topology == DEFAULT_TOPOLOGY else f"{self.topology}, "
        return (f"{deployment}{self.mode} mode, {self.steps} decode steps{ranks}, {per_step}"
                f"{entry}, faults: {faults}, DeepGEMM layout {self.deepgemm_layout}, "
                f"{self.schema_era} export")

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# Simulation objects
# ------------------------------------------------------------------------------------------------
class _Op:
    """One GPU activity (kernel or memcpy) waiting for its start/end."""

    __slots__ = ("kind", "kt", "stream", "earliest", "gap", "extra", "dur", "deps", "corr",
                 "node", "graph", "start", "end", "bytes", "src_kind", "collective", "tag")

    def __init__(self, kind, kt, stream, earliest, gap, dur, corr, deps=(), node=None,
                 graph=None, extra=0, nbytes=0, src_kind=1, tag=None):
        self.kind = kind  # "k" kernel, "c" H2D copy
        self.kt = kt
        self.stream = stream
        self.earliest = earliest
        self.gap = gap
        self.extra = extra
        self.dur = dur
        self.deps = deps
        self.corr = corr
        self.node = node
        self.graph = graph
        self.bytes = nbytes
        self.src_kind = src_kind
        self.collective = kt.collective if kt is not None else False
        self.tag = tag
        self.start = 0
        self.end = 0


class _Flush:
    """Sentinel a rank program yields at the end of a pass: rows so far can be written."""

    def __init__(self, label: str, step: int | None = None):
        self.label = label
        self.step = step


@dataclass
class _PassRecord:
    label: str
    step: int | None
    ops: list
    launches: list  # (correlationId) of graph launches
    copies: list
    sampling: _Op | None


class _Rank:
    """Host-side state and the records of one rank (one process, one GPU)."""

    def __init__(self, rank: int, cfg: "_Config"):
        self.rank = rank
        self.cfg = cfg
        self.pid = PID_BASE + rank  # its scheduler thread (the main thread) makes every call
        self.device = rank
        self.ctx = rank + 1
        self.launch_stream = STREAM_MAIN  # where the graphs are launched
        self.rng = np.random.default_rng([cfg.seed, rank, 0x5EED])
        self.t = T0 + 1_200_000_000 + rank * 37_000 + int(self.rng.integers(0, 20_000))
        self.corr = 0
        self.node_id = 0
        self.graph_id = 0
        self.exec_id = 1
        self.event_id = 0
        self.ready: dict[int, int] = {}
        # host records since the last flush, format-free (see synth/nsys_sqlite.py)
        self.api_calls: list[tuple] = []  # (start, end, name, correlationId)
        self.nvtx: list[tuple] = []  # (start, end, text)
        self.syncs: list[tuple] = []  # (start, end, stream, corr, syncType, event, eventSync)
        self.node_events: list[tuple] = []  # (start, end, api, node id, original node id)
        self.graph_events: list[tuple] = []  # (time, "graph" | "exec", graph id, exec id)
        self.ops: list[_Op] = []
        self.passes: list[_PassRecord] = []
        self.cur: _PassRecord | None = None
        self.nvtx_stack: list[tuple[str, int]] = []
        self.cur_texts: list[str] = []
        self.graph_execs: dict[int, int] = {}
        self.capture_nodes = 0
        scale = cfg.slow_factor if cfg.slow_rank == rank else 1.0
        layout = cfg.deepgemm_layout
        topology = cfg.topology
        self.decode_graph = S.decode_schedule(cfg.batch, cfg.faults, alt_streams=True,
                                              deepgemm_layout=layout, topology=topology)
        self.decode_eager = S.decode_schedule(cfg.batch, cfg.faults, alt_streams=False,
                                              deepgemm_layout=layout, topology=topology)
        self.prefill = S.prefill_schedule(cfg.batch, cfg.faults, deepgemm_layout=layout,
                                          topology=topology)
        # MTP: after the prefill's sampling the draft model extends over the prompt, eagerly
        self.prefill_draft_extend = (
            S.Schedule("prefill", cfg.batch, cfg.batch * S.PREFILL_TOKENS_PER_REQ,
                       S.mtp_prefill_extend(cfg.batch, cfg.faults, deepgemm_layout=layout,
                                            topology=topology),
                       self.prefill.sampling, topology=topology)
            if get_topology(topology).mtp else None)
        if scale != 1.0:
            self.decode_graph = S.with_durations(self.decode_graph, scale)
            self.decode_eager = S.with_durations(self.decode_eager, scale)
            self.prefill = S.with_durations(self.prefill, scale)
        # the prefill samples its next token with the target's sampler (with MTP the decode
        # step's eager kernel is the draft verification instead)
        self.prefill_sampler = self.decode_graph
        if self.prefill_draft_extend is not None:
            self.prefill_sampler = replace(self.decode_graph, sampling=S.KernelSpec(
                S.SAMPLING, "sampling", "outside", "", None, "main",
                S.decode_cost_ns(S.SAMPLING.key, cfg.batch), role="sampling"))

    # -- random helpers (deterministic per rank) ---------------------------------------------
    def u(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def jitter(self, n: int) -> np.ndarray:
        return self.rng.lognormal(0.0, 0.03, n)

    # -- host API calls -----------------------------------------------------------------------
    def api(self, name: str, dur: int) -> tuple[int, int, int]:
        """Record one runtime/driver API call at the current host time -> (start, end, corr)."""
        self.corr += 1
        start = self.t
        end = start + dur
        self.api_calls.append((start, end, name, self.corr))
        self.t = end
        return start, end, self.corr

    def stretch_last_call(self, start: int, end: int) -> None:
        """The last API call blocked: it spans [start, end] (a sync, a pageable copy)."""
        self.api_calls[-1] = (start, end, *self.api_calls[-1][2:])

    def nvtx_to(self, chain: tuple[str, ...], tokens: int) -> None:
        """Move the open layerwise NVTX ranges to exactly `chain` (pop, then push)."""
        stack = self.nvtx_stack
        keep = 0
        while keep < len(stack) and keep < len(chain) and stack[keep][0] == chain[keep]:
            keep += 1
        while len(stack) > keep:
            self.pop_range()
        for mod in chain[keep:]:
            # the marker's forward pre-hook walks the inputs and formats the dict text: slow
            # (real SGLang traces show tens of µs per module), which is what makes eager decode
            # with markers host bound
            self.t += self.u(12_000, 30_000)
            self.push_range(S.nvtx_marker_text(mod, tokens, self.cfg.topology), mod)

    def push_range(self, text: str, key: str) -> None:
        self.nvtx_stack.append((key, self.t))
        self.cur_texts.append(text)
        self.t += self.u(250, 500)

    def pop_range(self) -> None:
        key, start = self.nvtx_stack.pop()
        text = self.cur_texts.pop()
        self.t += self.u(3_000, 8_000)  # forward post-hook
        self.nvtx.append((start, self.t, text))
        self.t += self.u(200, 400)

    def new_pass(self, label: str, step: int | None = None) -> None:
        self.cur = _PassRecord(label, step, [], [], [], None)
        self.passes.append(self.cur)

    def emit(self, op: _Op) -> _Op:
        self.cur.ops.append(op)
        return op


@dataclass
class _Config:
    mode: str
    steps: int
    ranks: int
    batch: int
    seed: int
    faults: frozenset[str]
    step_nvtx: bool
    prefill: bool
    cuda_graph_trace: str
    slow_rank: int | None
    slow_factor: float
    layerwise_nvtx: bool
    driver_launches: bool  # the export's era records launches as driver calls (2021)
    # graph mode: the batch sizes captured, largest first as SGLang does (each its own graph;
    # decode replays the one of `batch`), and the clone links from an exec node to its capture node
    capture_batch_sizes: tuple[int, ...] = ()
    clone_links: int = 1
    deepgemm_layout: str = S.DEFAULT_DEEPGEMM_LAYOUT
    topology: str = DEFAULT_TOPOLOGY


# ------------------------------------------------------------------------------------------------
# The per-rank program (a generator: yields GPU ops, batches of ops, or _Flush sentinels)
# ------------------------------------------------------------------------------------------------
def _copy_plan(cfg: _Config) -> list[CopyTruth]:
    b = cfg.batch
    copies = [CopyTruth("page_table", b * 256, False), CopyTruth("seq_lens", b * 8, False),
              CopyTruth("sampling_params", b * 16, "pageable_h2d" in cfg.faults)]
    if "extra_h2d" in cfg.faults:
        copies.insert(2, CopyTruth("positions", b * 8, False))
    return copies


def _h2d(rs: _Rank, c: CopyTruth, gap_lo: int = 600, gap_hi: int = 1_200) -> Iterator:
    """One cudaMemcpyAsync host->device on the main stream. Pinned: async. Pageable: the call
    returns only once the staged copy has run (the host blocks on the GPU)."""
    rs.t += rs.u(800, 2_000)
    dur_api = rs.u(3_000, 4_500)
    start, _end, corr = rs.api(API_MEMCPY, dur_api)
    if c.pageable:
        gpu_dur = 1_800 + c.bytes * 1_000 // 8_000 + rs.u(0, 300)
        op = _Op("c", None, STREAM_MAIN, start + 2_500, rs.u(gap_lo, gap_hi), gpu_dur, corr,
                 nbytes=c.bytes, src_kind=0, tag=c.label)
    else:
        gpu_dur = 1_100 + c.bytes * 1_000 // 22_000 + rs.u(0, 200)
        op = _Op("c", None, STREAM_MAIN, start + 1_800, rs.u(gap_lo, gap_hi), gpu_dur, corr,
                 nbytes=c.bytes, src_kind=1, tag=c.label)
    rs.emit(op)
    rs.cur.copies.append(op)
    yield op
    if c.pageable:
        # the API call must cover the blocking wait: stretch it to the copy's end
        row = rs.api_calls[-1]
        end = max(row[1], op.end + rs.u(1_200, 2_000))
        rs.stretch_last_call(row[0], end)
        rs.t = end


def _launch_api(cfg: _Config, name: str) -> str:
    """The launch call `name` as the export's era records it (driver calls only in 2021)."""
    if not cfg.driver_launches:
        return name
    return API_DRIVER_GRAPH_LAUNCH if name == API_GRAPH_LAUNCH else API_DRIVER_LAUNCH


def _launch_kernel(rs: _Rank, spec: S.KernelSpec, *, stream: int, earliest_lat: tuple[int, int],
                   gap: int, dur: int, deps=(), extra: int = 0, capture: bool = False,
                   tag=None) -> _Op | None:
    """Host launch call for one kernel; returns the GPU op (None while capturing)."""
    rs.t += rs.u(2_000, 4_500)  # Python + torch dispatch before the launch call
    api_dur = rs.u(3_000, 5_500) if not capture else rs.u(2_500, 4_500)
    api = _launch_api(rs.cfg, spec.kernel.api)
    start, end, corr = rs.api(api, api_dur)
    if capture:
        rs.node_id += 1
        ns = start + (end - start) * 2 // 5
        rs.node_events.append((ns, ns + rs.u(150, 400), api, rs.node_id, None))
        return None
    return rs.emit(_Op("k", spec.kernel, stream, start + rs.u(*earliest_lat), gap, dur, corr,
                       deps=deps, extra=extra, tag=tag))


def _stream_of(spec: S.KernelSpec) -> int:
    return STREAM_ALT if spec.stream == "alt" else STREAM_MAIN


def _gap_sites(sched: S.Schedule, faults: frozenset[str]) -> dict[int, tuple[int | None, str, int, str]]:
    """Kernel index -> (layer, op, extra device delay ns, cause) of the gap before it."""
    sites = []
    if "extra_gaps" in faults:
        sites += [(layer, op, extra, "unknown") for layer, op, extra in GAP_SITES]
    if "extra_gaps_collective" in faults:
        sites += [(layer, op, extra, "collective") for layer, op, extra in COLLECTIVE_GAP_SITES]
    out = {}
    for layer, op, extra, cause in sites:
        for i, k in enumerate(sched.kernels):
            if k.layer == layer and k.op == op:
                out[i] = (layer, op, extra, cause)
                break
    if "extra_gaps_sync" in faults:  # the host-side wait delays the first kernel of the pass
        first = sched.kernels[0]
        out[0] = (first.layer, first.op, 0, "sync")
    if "extra_gaps_graph" in faults:  # before the first node of the second replay
        at = sched.split_index()
        out[at] = (sched.kernels[at].layer, sched.kernels[at].op, GRAPH_GAP_NS, "graph_boundary")
    return out


def _eager_forward(rs: _Rank, sched: S.Schedule, *, capture: bool = False,
                   nvtx: bool = True, gaps: dict | None = None, step: int | None = None,
                   node_ids: list | None = None) -> Iterator:
    """Launch every kernel of `sched` from the host, one launch call each (eager or capture)."""
    n = len(sched.kernels)
    jit = rs.jitter(n)
    ops: list[_Op | None] = [None] * n
    for i, spec in enumerate(sched.kernels):
        if nvtx:
            rs.nvtx_to(S.module_chain(spec.module), sched.tokens)
        deps = ()
        if spec.deps:
            # torch wait_stream(): record an event on the other stream, wait on it
            rs.t += rs.u(300, 800)
            rs.api(API_EVENT_RECORD, rs.u(1_500, 3_000))
            rs.api(API_WAIT_EVENT, rs.u(1_000, 2_000))
            deps = tuple(ops[j] for j in spec.deps if ops[j] is not None)
        extra = 0
        tag = None
        if gaps and i in gaps:
            extra = gaps[i][2]
            tag = ("gap", step, gaps[i])
        op = _launch_kernel(rs, spec, stream=_stream_of(spec), earliest_lat=(2_000, 3_500),
                            gap=rs.u(700, 1_500), dur=int(spec.dur_ns * jit[i]), deps=deps,
                            extra=extra, capture=capture, tag=tag)
        if capture:
            node_ids.append(rs.node_id)
        else:
            ops[i] = op
            yield op
    if nvtx:
        rs.nvtx_to((), sched.tokens)


def _eager_launches(rs: _Rank, sched: S.Schedule, lo: int, hi: int) -> Iterator:
    """Graph mode: the kernels [lo, hi) of `sched` that run outside the graphs, one launch
    call each on the main stream (vLLM's eager attention ops between PIECEWISE graphs, its
    indexer metadata before the graph, its LM head and logits gather after it)."""
    for spec in sched.kernels[lo:hi]:
        yield _launch_kernel(rs, spec, stream=STREAM_MAIN, earliest_lat=(2_000, 3_500),
                             gap=rs.u(700, 1_500), dur=int(spec.dur_ns * rs.jitter(1)[0]))


def _sampling(rs: _Rank, sched: S.Schedule, tag=None) -> Iterator:
    spec = sched.sampling
    op = _launch_kernel(rs, spec, stream=STREAM_MAIN, earliest_lat=(2_000, 3_200),
                        gap=rs.u(700, 1_500), dur=int(spec.dur_ns * rs.jitter(1)[0]), tag=tag)
    rs.cur.sampling = op
    yield op


def _late_sampling(rs: _Rank, sched: S.Schedule, step: int) -> Iterator:
    """"extra_gaps_host": the sampling metadata is prepared only after the forward pass has
    finished on the device, so the sampling launch comes HOST_GAP_NS after the device ran dry."""
    forward_end = max(o.end for o in rs.cur.ops)
    rs.t = max(rs.t, forward_end + HOST_GAP_NS)
    tag = ("gap", step, (None, "sampling", HOST_GAP_NS, "host"))
    yield from _sampling(rs, sched, tag=tag)


def _stream_sync(rs: _Rank, stream: int) -> None:
    """cudaStreamSynchronize: the host blocks until every op queued on `stream` has run."""
    last = rs.ready.get(stream, rs.t)
    rs.t += rs.u(1_000, 3_000)
    start = rs.t
    _s, _e, corr = rs.api(API_STREAM_SYNC, 1_500)
    end = max(start + rs.u(800, 1_500), last + rs.u(1_500, 3_000))
    rs.stretch_last_call(start, end)
    rs.syncs.append((start, end, stream, corr, 3, 0, None))
    rs.t = end


def _capture(rs: _Rank, sched: S.Schedule, parts: list[tuple[int, int]]) -> list[dict]:
    """Capture each part of the decode forward into a graph and instantiate it.

    Returns per part: graph id, exec id, exec node ids (per kernel of the part)."""
    cfg = rs.cfg
    graphs = []
    for lo, hi in parts:
        rs.t += rs.u(40_000, 90_000)
        start, end, _ = rs.api(API_BEGIN_CAPTURE, rs.u(4_000, 7_000))
        rs.graph_id += 1
        gid = rs.graph_id
        ge = start + (end - start) * 3 // 4
        rs.graph_events.append((ge, "graph", gid, None))
        part = S.Schedule(sched.kind, sched.batch, sched.tokens, sched.kernels[lo:hi],
                          sched.sampling, sched.faults)
        # indices in `part` are local; deps point inside the part (splits fall on layer edges)
        part = _localize(part, lo)
        capture_ids: list[int] = []
        for _ in _eager_forward(rs, part, capture=True, nvtx=cfg.layerwise_nvtx,
                                node_ids=capture_ids):
            pass  # capture yields no GPU ops
        rs.t += rs.u(1_000, 3_000)
        rs.api(API_END_CAPTURE, rs.u(20_000, 60_000))
        # instantiate: two internal graphs, one exec graph whose nodes are clones
        rs.t += rs.u(5_000, 15_000)
        n = len(capture_ids)
        inst_dur = 400_000 + n * rs.u(2_600, 3_400)
        istart, iend, _ = rs.api(API_INSTANTIATE, inst_dur)
        for k in range(2):
            rs.graph_id += 1
            tg = istart + 20_000 + k * 4_000
            rs.graph_events.append((tg, "graph", rs.graph_id, None))
        rs.exec_id += 1
        eid = rs.exec_id
        exec_ids = []
        step_ns = (inst_dur - 120_000) // max(n, 1)
        for j, cid in enumerate(capture_ids):
            t = istart + 60_000 + j * step_ns
            # each clone's originalGraphNodeId is the node it was cloned from: a chain of
            # `clone_links` links from the exec node back to the node made during capture
            origin = cid
            for link in range(cfg.clone_links):
                rs.node_id += 1
                tl = t + link * 40
                rs.node_events.append((tl, tl + 120, API_INSTANTIATE, rs.node_id, origin))
                origin = rs.node_id
            exec_ids.append(rs.node_id)
        te = iend - 30_000
        rs.graph_events.append((te, "exec", gid, eid))
        rs.graph_execs[gid] = eid
        rs.capture_nodes += n
        graphs.append({"graph": gid, "exec": eid, "nodes": exec_ids, "lo": lo, "hi": hi,
                       "part": part})
    return graphs


def _localize(part: S.Schedule, lo: int) -> S.Schedule:
    ks = tuple(replace(k, deps=tuple(d - lo for d in k.deps if d >= lo)) for k in part.kernels)
    return replace(part, kernels=ks)


def step_entry_gap_ns(seed: int, rank: int, step: int) -> int:
    """The step-entry launch gap planned for decode `step` of `rank`: within STEP_ENTRY_GAP_NS,
    fixed by the seed, drawn apart from the rank's random stream (the rest of the timeline
    does not move when this rule changes)."""
    lo, hi = STEP_ENTRY_GAP_NS
    return int(np.random.default_rng([seed, rank, step, 0xE47]).integers(lo, hi + 1))


def _graph_replay(rs: _Rank, g: dict, gaps: dict | None, step: int,
                  entry_after: _Op | None = None) -> Iterator:
    """One cudaGraphLaunch: every node becomes a kernel row sharing the launch's correlationId.

    entry_after: the step's last H2D copy when this is the step's first replay. The launch
    call is then timed from the device: it returns after that copy ended, and the first node
    runs step_entry_gap_ns after the copy (later only if the host itself arrives late)."""
    part: S.Schedule = g["part"]
    if "static" not in g:
        g["static"] = [(k.kernel, _stream_of(k), k.deps, node)
                       for k, node in zip(part.kernels, g["nodes"])]
        g["durs"] = np.array([k.dur_ns for k in part.kernels], dtype=np.float64)
    n = len(part.kernels)
    rs.t += rs.u(2_000, 5_000)  # build the replay's inputs
    launch_ns = int(GRAPH_LAUNCH_BASE_NS + GRAPH_LAUNCH_PER_NODE_NS * n) + rs.u(0, 1_500)
    to_kernel = rs.u(*LAUNCH_TO_KERNEL_NS)
    if entry_after is not None:
        first_kernel = entry_after.end + step_entry_gap_ns(rs.cfg.seed, rs.rank, step)
        # the host's work before the call ends where the call must start to return on time
        rs.t = max(rs.t, first_kernel - to_kernel - launch_ns)
    _start, end, corr = rs.api(_launch_api(rs.cfg, API_GRAPH_LAUNCH), launch_ns)
    rs.cur.launches.append(corr)
    durs = (g["durs"] * rs.jitter(n)).astype(np.int64).tolist()
    gaps_ns = rs.rng.integers(500, 1_001, n).tolist()
    earliest = end + to_kernel
    graph = g["graph"]
    lo = g["lo"]
    ops: list[_Op] = []
    append = ops.append
    for i, (kt, stream, deps, node) in enumerate(g["static"]):
        op = _Op("k", kt, stream, earliest, gaps_ns[i], durs[i], corr,
                 deps=tuple(ops[j] for j in deps) if deps else (), node=node, graph=graph)
        if gaps and i + lo in gaps:
            op.extra = gaps[i + lo][2]
            op.tag = ("gap", step, gaps[i + lo])
        append(op)
    rs.cur.ops.extend(ops)
    yield ops


def _startup(rs: _Rank) -> None:
    rs.api("cuModuleGetLoadingMode", rs.u(1_000, 3_000))
    rs.t += rs.u(2_000_000, 4_000_000)
    rs.api("cudaGetDeviceCount_v3020", rs.u(500, 1_500))
    rs.api("cudaSetDevice_v3020", rs.u(30_000, 60_000))
    for _ in range(3):
        rs.api("cudaStreamCreateWithPriority_v5050", rs.u(8_000, 20_000))
    for size in range(4):
        rs.api("cudaMalloc_v3020", rs.u(40_000, 900_000))
    rs.api("cudaHostAlloc_v3020", rs.u(200_000, 600_000))
    rs.t += rs.u(40_000_000, 60_000_000)  # weight loading, NCCL / DeepEP init (not traced)


def _device_sync(rs: _Rank) -> None:
    last = max(rs.ready.values(), default=rs.t)
    rs.t += rs.u(1_000, 3_000)
    start = rs.t
    _s, _e, corr = rs.api(API_DEVICE_SYNC, 2_000)
    end = max(start + 2_000, last + rs.u(1_500, 3_000))
    rs.stretch_last_call(start, end)
    rs.syncs.append((start, end, STREAM_NULL, corr, 4, 0, None))
    rs.t = end


def _event_sync(rs: _Rank, target: _Op | None) -> None:
    """cudaEventRecord after the pass, then cudaEventSynchronize on the previous pass's event."""
    rs.t += rs.u(500, 1_500)
    rs.event_id += 1
    rs.api(API_EVENT_RECORD, rs.u(1_500, 3_000))
    if target is None:
        return
    rs.t += rs.u(1_000, 3_000)
    start = rs.t
    _s, _e, corr = rs.api(API_EVENT_SYNC, 1_200)
    end = max(start + rs.u(800, 1_500), target.end + rs.u(1_500, 3_000))
    rs.stretch_last_call(start, end)
    rs.syncs.append((start, end, STREAM_MAIN, corr, 1, rs.event_id - 1, rs.event_id - 1))
    rs.t = end


def _step_range_text(cfg: _Config, prefill: bool) -> str:
    """The name of the range around one forward pass: SGLang-style `decode bs=32`, or vLLM
    V1's step annotation (gpu_model_runner: `execute_context_{n}({tokens})_generation_{m}
    ({tokens})`, n prefill and m decode requests; the real vLLM traces in
    shared/real_traces/kineto carry it, e.g. `execute_context_1(888_788544)_generation_0(0)`)."""
    if get_topology(cfg.topology).framework != "vllm":
        return f"{'prefill' if prefill else 'decode'} bs={cfg.batch}"
    b = cfg.batch
    if prefill:
        return f"execute_context_{b}({b * S.PREFILL_TOKENS_PER_REQ})_generation_0(0)"
    return f"execute_context_0(0)_generation_{b}({b})"


def _rank_program(rs: _Rank) -> Iterator:
    cfg = rs.cfg
    graph_mode = cfg.mode == "graph"
    gap_sched = rs.decode_graph if graph_mode else rs.decode_eager
    gaps = _gap_sites(gap_sched, cfg.faults) or None
    copies = _copy_plan(cfg)
    rs.new_pass("startup")
    _startup(rs)
    graphs: list[dict] = []
    if graph_mode:
        rs.new_pass("warmup")
        yield from _eager_forward(rs, rs.decode_graph, nvtx=cfg.layerwise_nvtx)
        _device_sync(rs)
        yield _Flush("warmup")
        rs.new_pass("capture")
        if SPLIT_FAULTS & cfg.faults:
            si = rs.decode_graph.split_index()
            parts = [(0, si), (si, len(rs.decode_graph.kernels))]
        else:
            # one graph, with MTP the draft, verify and draft_extend graphs of the step, with
            # vLLM's PIECEWISE mode one graph per piece between the eager attention launches
            parts = [(lo, hi) for lo, hi, in_graph in rs.decode_graph.segments() if in_graph]
        for bs in cfg.capture_batch_sizes or (cfg.batch,):
            # one graph per captured batch size; its layer-wise NVTX text carries that size
            sched = rs.decode_graph if bs == cfg.batch else S.decode_schedule(
                bs, cfg.faults, deepgemm_layout=cfg.deepgemm_layout, topology=cfg.topology)
            captured = _capture(rs, sched, parts)
            if bs == cfg.batch:
                graphs = captured
        _device_sync(rs)
        yield _Flush("capture")
    prev_sampling: _Op | None = None
    serve = (["prefill"] if cfg.prefill else []) + [f"decode:{k}" for k in range(cfg.steps)]
    for label in serve:
        step = None if label == "prefill" else int(label.split(":")[1])
        rs.new_pass("prefill" if step is None else "decode", step)
        rs.t += rs.u(120_000, 260_000)  # scheduler: pick the batch, build the ForwardBatch
        if cfg.step_nvtx:  # a user range around the whole forward pass, outside the markers
            rs.t += rs.u(1_000, 2_000)
            step_range = (rs.t, _step_range_text(cfg, step is None))
            rs.t += rs.u(250, 500)
        for c in copies:
            yield from _h2d(rs, c)
        if step is not None and "extra_gaps_sync" in cfg.faults:
            _stream_sync(rs, STREAM_MAIN)  # the step's first kernel waits for the host (gap site 0)
            rs.t += SYNC_GAP_HOST_NS
        sampled = False
        if step is None:
            yield from _eager_forward(rs, rs.prefill, nvtx=cfg.layerwise_nvtx)
        elif graph_mode and SPLIT_FAULTS & cfg.faults:
            for gi, g in enumerate(graphs):
                if gi > 0 and "split_graph" in cfg.faults:  # a small H2D copy between the replays
                    yield from _h2d(rs, CopyTruth("split_metadata", cfg.batch * 4, False))
                entry = rs.cur.copies[-1] if gi == 0 else None
                yield from _graph_replay(rs, g, gaps, step, entry_after=entry)
        elif graph_mode:
            sample_after = rs.decode_graph.sampling_after_graph
            replays = iter(graphs)
            gi = 0
            for si, (lo, hi, in_graph) in enumerate(rs.decode_graph.segments()):
                if not in_graph:  # vLLM: eager launches before, between or after the graphs
                    yield from _eager_launches(rs, rs.decode_graph, lo, hi)
                    continue
                # the step's first launch is timed from its last H2D copy (the step entry)
                entry = rs.cur.copies[-1] if si == 0 else None
                yield from _graph_replay(rs, next(replays), gaps, step, entry_after=entry)
                if gi == sample_after:  # MTP: verify the draft before the draft_extend replay
                    yield from _sampling(rs, rs.decode_graph)
                    sampled = True
                gi += 1
        else:
            yield from _eager_forward(rs, rs.decode_eager, nvtx=cfg.layerwise_nvtx, gaps=gaps,
                                      step=step)
        if sampled:
            pass
        elif step is not None and "extra_gaps_host" in cfg.faults:
            yield from _late_sampling(rs, rs.decode_graph, step)
        else:
            yield from _sampling(rs, rs.decode_graph if step is not None else rs.prefill_sampler)
        if step is None and rs.prefill_draft_extend is not None:
            yield from _eager_forward(rs, rs.prefill_draft_extend, nvtx=cfg.layerwise_nvtx)
        if cfg.step_nvtx:
            rs.t += rs.u(300, 800)
            rs.nvtx.append((step_range[0], rs.t, step_range[1]))
            rs.t += rs.u(200, 400)
        # graph mode: overlap scheduler, wait for the previous pass only; eager mode: the
        # scheduler waits for this pass before preparing the next (no overlap)
        _event_sync(rs, prev_sampling if graph_mode else rs.cur.sampling)
        prev_sampling = rs.cur.sampling if graph_mode else None
        rs.t += rs.u(80_000, 180_000)  # process the batch result
        yield _Flush(label, step)
    if prev_sampling is not None:
        _event_sync(rs, prev_sampling)
    yield _Flush("end")


# ------------------------------------------------------------------------------------------------
# GPU simulation (all ranks in lock step, so collectives can wait for their peers)
# ------------------------------------------------------------------------------------------------
def _simulate(ops: list[_Op], ranks: list[_Rank]) -> None:
    for op, rs in zip(ops, ranks):
        ready = rs.ready.get(op.stream, 0)
        for d in op.deps:
            if d.end > ready:
                ready = d.end
        s = ready + op.gap
        if op.earliest > s:
            s = op.earliest
        op.start = s + op.extra
    if ops[0].collective and len(ops) > 1:
        t = max(op.start for op in ops)
        for op, rs in zip(ops, ranks):
            op.end = t + op.dur
            rs.ready[op.stream] = op.end
    else:
        for op, rs in zip(ops, ranks):
            op.end = op.start + op.dur
            rs.ready[op.stream] = op.end


def _simulate_batch(batches: list[list[_Op]], ranks: list[_Rank]) -> None:
    if len(ranks) == 1:
        ready = ranks[0].ready
        for op in batches[0]:
            r = ready.get(op.stream, 0)
            for d in op.deps:
                if d.end > r:
                    r = d.end
            s = r + op.gap
            if op.earliest > s:
                s = op.earliest
            op.start = s + op.extra
            op.end = op.start + op.dur
            ready[op.stream] = op.end
        return
    for col in zip(*batches):
        _simulate(list(col), ranks)


def _merged_gaps(ops: list[_Op], lo: int, hi: int) -> tuple[int, int, list[tuple[int, int]]]:
    """Largest idle gap of the union of [start, end) intervals clipped to [lo, hi]."""
    iv = sorted((o.start, o.end) for o in ops if o.end > lo and o.start < hi)
    max_gap, n_over, gaps = 0, 0, []
    cur = lo
    for s, e in iv:
        if s > cur:
            g = s - cur
            gaps.append((cur, s))
            max_gap = max(max_gap, g)
            if g > GAP_THRESHOLD_NS:
                n_over += 1
        cur = max(cur, e)
    return max_gap, n_over, gaps


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------
def generate(out_path: str | Path, *, mode: str = "graph", steps: int = 8, ranks: int = 1,
             batch: int = 32, seed: int = 0, faults: tuple[str, ...] | list[str] = (),
             step_nvtx: bool = False, prefill: bool = True, slow_rank: int | None = None,
             slow_factor: float = 1.2, cuda_graph_trace: str = "node",
             layerwise_nvtx: bool = True, era: SchemaEra = ERA_2026_2,
             vacuum: bool = False, nsys_version: str | None = None,
             capture_batch_sizes: tuple[int, ...] | None = None,
             clone_links: int = 1,
             deepgemm_layout: str | None = None,
             topology: str = DEFAULT_TOPOLOGY, format: str = "sqlite") -> GenerateSummary:
    """Write one synthetic nsys export of SGLang GLM-5.3 decode and return the truth about it.

    topology: the deployment simulated, one of synth.topologies.TOPOLOGIES: "glm-5.3-tp8-ep8"
    (default), "glm-5.3-dp8-ep8" (DP attention), "glm-5.3-tp8-ep8-mtp" (MTP: draft, verify and
    draft_extend graphs per step; graph mode only; the fault "missing_draft_replay" drops the
    draft replay), "deepseek-v3.2-tp8-ep8".

    mode: "graph" (decode replayed from CUDA graphs, `--cuda-graph-trace=node`) or "eager".
    faults: any of FAULTS. slow_rank: that rank's kernels run `slow_factor` times longer.
    cuda_graph_trace: "node" (default) or "graph" (graph-level rows in
    CUPTI_ACTIVITY_KIND_GRAPH_TRACE instead of per-node kernel rows; graph mode only).
    nsys_version: write the layout that nsys release wrote ("2021", "2022", "2023.1" ... "2026";
    see synth/schema_eras.py) instead of `era`. The timeline is the same in every layout.
    capture_batch_sizes (graph mode): capture one decode graph per batch size, largest first
    (must include `batch`, the one decode replays). clone_links (graph mode): clone links from
    each exec node back to the node created at capture (instantiation may clone several times).
    deepgemm_layout: the DeepGEMM build whose kernel names the trace carries, one of
    synth.deepgemm.DEEPGEMM_LAYOUTS ("2025-02", "2025-07", "sglang-2026", "b200"); None: the
    topology's engine's, "sglang-2026" for SGLang, "2025-07" (upstream DeepGEMM) for vLLM.
    A vLLM topology ("glm-5.3-vllm-tp8-ep8", its "-piecewise" variant, "deepseek-v3.2-vllm-
    tp8-ep8") writes vLLM's launches (synth/vllm.py) and no SGLang layer-wise markers
    (layerwise_nvtx is ignored); its step range (step_nvtx) is vLLM's step annotation.
    format: "sqlite" (an nsys export, default) or "kineto" (the PyTorch profiler's gzip JSON of
    the same timeline: synth/kineto_writer.py; one rank, node-level kernels, no nsys layout)."""
    t_begin = time.perf_counter()
    sizes = tuple(sorted(set(capture_batch_sizes or (batch,)), reverse=True))
    if batch not in sizes:
        raise ValueError(f"capture_batch_sizes must include the decode batch {batch}")
    if clone_links < 1:
        raise ValueError("clone_links must be at least 1")
    if nsys_version is not None:
        era = era_for_version(nsys_version)
    if cuda_graph_trace == "graph" and not era.has("CUPTI_ACTIVITY_KIND_GRAPH_TRACE"):
        raise ValueError(f"graph-level traces are written in the 2024+ layouts, not {era.name}")
    if mode not in ("graph", "eager"):
        raise ValueError(f"mode must be 'graph' or 'eager', not {mode!r}")
    topo = get_topology(topology)
    if deepgemm_layout is None:
        deepgemm_layout = VLLM_DEEPGEMM_LAYOUT if topo.framework == "vllm" else S.DEFAULT_DEEPGEMM_LAYOUT
    if topo.framework == "vllm":
        layerwise_nvtx = False  # SGLang's marker; vLLM writes no per-module ranges by default
        unsupported = sorted(set(faults) - VLLM_FAULTS)
        if unsupported or mode != "graph" or format != "sqlite":
            raise ValueError(f"{topology} is simulated in graph mode as an nsys SQLite export, with "
                             f"the faults {sorted(VLLM_FAULTS)} only")
    bad = sorted(set(faults) - set(FAULTS) - set(TOPOLOGY_FAULTS))
    if bad:
        raise ValueError(f"unknown faults {bad}; known: {FAULTS + TOPOLOGY_FAULTS}")
    if set(faults) & set(TOPOLOGY_FAULTS) and not topo.mtp:
        raise ValueError("missing_draft_replay needs a topology with MTP")
    if topo.mtp and (mode != "graph" or SPLIT_FAULTS & set(faults) or
                     "extra_gaps_host" in faults or cuda_graph_trace != "node"):
        raise ValueError(f"{topology} is simulated in graph mode with node-level tracing, "
                         "without split_graph, extra_gaps_graph or extra_gaps_host")
    if cuda_graph_trace not in ("node", "graph"):
        raise ValueError("cuda_graph_trace must be 'node' or 'graph'")
    split = SPLIT_FAULTS & set(faults)
    if mode == "eager" and split:
        raise ValueError(f"{min(split)} needs mode='graph'")
    if mode == "eager" and "extra_gaps_collective" in faults:
        # eager launches are late anyway: the gap before the collective would be the host's
        raise ValueError("extra_gaps_collective needs mode='graph'")
    if slow_rank is not None and not 0 <= slow_rank < ranks:
        raise ValueError("slow_rank must name one of the ranks")
    S.check_layout(deepgemm_layout)
    if format not in ("sqlite", "kineto"):
        raise ValueError(f"format must be 'sqlite' or 'kineto', not {format!r}")
    if format == "kineto" and (ranks != 1 or cuda_graph_trace != "node" or nsys_version):
        # the profiler writes one file per rank and every replayed kernel; nsys layouts are nsys's
        raise ValueError("format='kineto' writes one rank's profile (ranks=1) with every replayed kernel "
                         "(cuda_graph_trace='node') and no nsys layout (nsys_version=None)")
    out_path = Path(out_path)
    if format == "kineto":
        export = KinetoTraceExport(out_path, seed=seed)
    else:
        export = NsysSqliteExport(out_path, era, seed=seed, graph_level=cuda_graph_trace == "graph")
    cfg = _Config(mode, steps, ranks, batch, seed, frozenset(faults), step_nvtx, prefill,
                  cuda_graph_trace, slow_rank, slow_factor, layerwise_nvtx, era.driver_launches,
                  capture_batch_sizes=sizes, clone_links=clone_links,
                  deepgemm_layout=deepgemm_layout, topology=topo.name)
    rks = [_Rank(r, cfg) for r in range(ranks)]
    gens = [_rank_program(rs) for rs in rks]
    truth_steps: list[StepTruth] = []
    injected: list[InjectedGap] = []
    warmup_kernels = prefill_kernels = 0
    while True:
        items = [next(g, None) for g in gens]
        first = items[0]
        if first is None:
            assert all(i is None for i in items)
            break
        if isinstance(first, _Flush):
            assert all(isinstance(i, _Flush) for i in items)
            for rs in rks:
                for p in rs.passes:
                    if p.label == "warmup" and rs.rank == 0:
                        warmup_kernels = sum(1 for o in p.ops if o.kind == "k")
                    if p.label == "prefill" and rs.rank == 0:
                        prefill_kernels = sum(1 for o in p.ops if o.kind == "k")
                    if p.label == "decode":
                        truth_steps.append(_step_truth(rs, p))
                        injected.extend(_injected(rs, p))
                export.write_rank(rs)
                # written; the program keeps what it still needs (the previous sampling kernel)
                rs.passes = []
                rs.api_calls, rs.nvtx, rs.syncs, rs.node_events, rs.graph_events = \
                    [], [], [], [], []
            continue
        if isinstance(first, list):
            _simulate_batch(items, rks)
        else:
            _simulate(items, rks)

    export.finish(CaptureFacts(mode, steps, ranks, batch, seed, frozenset(faults),
                               cuda_graph_trace, T0, PID_BASE - 3, STREAMS, STREAM_NULL),
                  rks, vacuum=vacuum)

    sched = rks[0].decode_graph if mode == "graph" else rks[0].decode_eager
    names = sched.name_counts()
    shorts = Counter()
    for k in sched.kernels:
        shorts[k.kernel.short] += 1
    shorts[sched.sampling.kernel.short] += 1
    copies = tuple(_copy_plan(cfg))
    if "split_graph" in faults:
        copies = copies + (CopyTruth("split_metadata", batch * 4, False),)
    in_graph = [k for k in sched.kernels if not k.eager]
    n_graph = len(in_graph) if mode == "graph" else 0
    graph_parts = sum(1 for _lo, _hi, g in sched.segments() if g)
    summary = GenerateSummary(
        path=str(out_path), mode=mode, steps=steps, ranks=ranks, batch=batch, seed=seed,
        faults=tuple(faults), cuda_graph_trace=cuda_graph_trace,
        kernels_per_step=len(sched.kernels) + 1, graph_kernels_per_step=n_graph,
        step_kernel_counts=names, step_short_counts=dict(shorts),
        step_group_counts=sched.counts_by_group(),
        graph_launches_per_step=(2 if SPLIT_FAULTS & set(faults) else graph_parts)
        if mode == "graph" else 0,
        h2d_per_step=len(copies), pageable_h2d_per_step=sum(c.pageable for c in copies),
        copies_per_step=copies,
        # graph mode: as before 1 for an all-graph pass; with eager launches (vLLM) its graph
        # launches plus its eager kernel launches
        launch_calls_per_step=(1 if n_graph == len(sched.kernels) else
                               graph_parts + len(sched.kernels) - n_graph) if mode == "graph"
        else len(sched.kernels) + 1,
        prefill_kernels=prefill_kernels, warmup_kernels=warmup_kernels,
        capture_nodes=rks[0].capture_nodes, injected_gaps=injected, step_truth=truth_steps,
        pids=tuple(rs.pid for rs in rks), devices=tuple(rs.device for rs in rks),
        main_stream=STREAM_MAIN, alt_stream=STREAM_ALT, slow_rank=slow_rank,
        slow_factor=slow_factor if slow_rank is not None else 1.0,
        rows=dict(export.rows_written), elapsed_s=time.perf_counter() - t_begin,
        step_layer_kernels=tuple(sched.layer_counts()),
        step_outside_layer_kernels=len(sched.kernels) + 1 - sum(sched.layer_counts()),
        captured_batch_sizes=sizes if mode == "graph" else (),
        clone_links=clone_links if mode == "graph" else 0,
        deepgemm_layout=deepgemm_layout, schema_era=era.name if format == "sqlite" else format,
        step_entry_gaps_ns=tuple(t.entry_gap_ns for t in truth_steps
                                 if t.entry_gap_ns is not None),
        topology=topo.name)
    return summary


def _step_truth(rs: _Rank, p: _PassRecord) -> StepTruth:
    start = min(o.start for o in p.copies)
    end = p.sampling.end
    max_gap, n_over, _ = _merged_gaps(p.ops, start, end)
    entry_gap = None
    after_entry = max_gap
    replayed = [o for o in p.ops if o.graph is not None]
    if replayed:
        first = min(o.start for o in replayed)
        last_copy_end = max(o.end for o in p.copies if o.start < first)
        entry_gap = first - last_copy_end
        after_entry = _merged_gaps(p.ops, first, end)[0]
        if entry_gap == step_entry_gap_ns(rs.cfg.seed, rs.rank, p.step):
            n_over -= 1  # the host was on time: the planned launch gap is not a fault
    return StepTruth(rs.rank, p.step, start, end, sum(1 for o in p.ops if o.kind == "k"),
                     len(p.copies), tuple(p.launches), p.sampling.corr, max_gap, n_over,
                     entry_gap, after_entry)


def _injected(rs: _Rank, p: _PassRecord) -> list[InjectedGap]:
    out = []
    for op in p.ops:
        if op.tag and op.tag[0] == "gap":
            layer, name, extra, cause = op.tag[2]
            prev_end = max(o.end for o in p.ops if o.start < op.start)
            out.append(InjectedGap(rs.rank, p.step, layer, name, op.kt.name, extra, prev_end,
                                   op.start, cause))
    return out
