"""The nsys SQLite format of a synthetic timeline: rows, string ids, global ids, metadata.

The timeline (synth/generate.py) says what ran when: GPU activities (kernels, copies) with
their stream, launch correlation and graph node; host API calls, NVTX ranges, synchronizations
and graph-creation events, all as plain records with names, never as rows of a format. This
module turns those records into the tables an nsys export of `era` holds: StringIds instead of
names, `globalPid`/`globalTid` packing, the static launch columns of each kernel, graph-level
rows for `--cuda-graph-trace=graph`, CUDA backtrace duplicates (2022), the order rows land in
(sorted up to 2025.5, buffer-interleaved from 2026.2), and the capture's metadata tables.
A writer of another format (a Kineto JSON) reads the same records.

Host records, per rank (tuples, in host order):
    api_calls     (start, end, name, correlationId)
    nvtx          (start, end, text)
    syncs         (start, end, streamId, correlationId, syncType, eventId, eventSyncId)
    node_events   (start, end, api name, graphNodeId, originalGraphNodeId or None)
    graph_events  (time, "graph" | "exec", graphId, graphExecId or None)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nsys_ledger.synth import schedule as S
from nsys_ledger.synth.nsys_schema import SchemaEra
from nsys_ledger.synth.writer import SqliteTraceWriter

VM_BITS = 1 << 48  # <HW:8=0><VM:8=1> as in the real exports
EC_BACKTRACE = 67  # 2022 exports: a CUDA backtrace row duplicating each runtime call
EC_NODE_CREATE = 77  # ENUM_NSYS_EVENT_CLASS: CUDA graph node creation
EC_GRAPHEXEC_CREATE = 94
EC_GRAPH_CREATE = 95
NVTX_PUSHPOP = 59
_VERSION_SUFFIX = re.compile(r"_v\d+$")  # backtrace rows name the call without it
_GRAPH_EVENT = {"graph": (EC_GRAPH_CREATE, "Graph Creation"),
                "exec": (EC_GRAPHEXEC_CREATE, "GraphExec Creation")}

KERNEL_COLS = (
    "start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId",
    "globalPid", "demangledName", "shortName", "mangledName", "launchType", "cacheConfig",
    "registersPerThread", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
    "staticSharedMemory", "dynamicSharedMemory", "localMemoryPerThread", "localMemoryTotal",
    "gridId", "sharedMemoryExecuted", "graphNodeId", "sharedMemoryLimitConfig", "graphId",
    "clusterX", "clusterY", "clusterZ", "clusterSchedulingPolicy", "maxPotentialClusterSize",
    "maxActiveClusters", "tensorSizeMinusOneElements")
MEMCPY_COLS = ("start", "end", "deviceId", "contextId", "greenContextId", "streamId",
               "correlationId", "globalPid", "bytes", "copyKind", "srcKind", "dstKind",
               "graphNodeId", "copyCount")
RUNTIME_COLS = ("start", "end", "eventClass", "globalTid", "correlationId", "nameId",
                "returnValue")
NVTX_COLS = ("start", "end", "eventType", "text", "globalTid", "domainId")
SYNC_COLS = ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid",
             "syncType", "eventId", "eventSyncId")
NODE_EVENT_COLS = ("start", "end", "eventClass", "globalTid", "nameId", "graphNodeId",
                   "originalGraphNodeId")
GRAPH_EVENT_COLS = ("start", "end", "eventClass", "globalTid", "nameId", "graphId",
                    "originalGraphId", "graphExecId")
GRAPH_TRACE_COLS = ("start", "end", "deviceId", "contextId", "greenContextId", "streamId",
                    "correlationId", "globalPid", "graphId", "graphExecId")


def global_pid(pid: int) -> int:
    """nsys's globalPid: <HW 0><VM 1><pid 24><tid 24 = 0>."""
    return VM_BITS | (pid << 24)


def global_tid(pid: int, tid: int) -> int:
    return global_pid(pid) | tid


def api_event_class(name: str) -> int:
    """ENUM_NSYS_EVENT_CLASS of an API call: 1 for driver calls (`cu...`), 0 for runtime ones."""
    return 1 if name.startswith("cu") and not name.startswith("cuda") else 0


@dataclass(frozen=True)
class CaptureFacts:
    """What the export's metadata tables say about the run (not about single events)."""

    mode: str
    steps: int
    ranks: int
    batch: int
    seed: int
    faults: frozenset[str]
    cuda_graph_trace: str  # "node" or "graph"
    session_start: int  # trace clock at the session start
    launcher_pid: int  # the `python3` process that started the ranks
    streams: tuple[tuple[int, int, int], ...]  # every rank's streams: (streamId, priority, flag)
    null_stream: int


_SMEM_CARVEOUTS = (0, 8_192, 16_384, 32_768, 65_536, 102_400, 135_168, 167_936, 233_472)
# Activity buffers: how many records one holds before it is handed over (rows of one buffer
# stay in order; buffers of different streams or threads interleave)
_BUFFER_ROWS = (24, 160)


def _buffer_interleaved(rows: list[tuple], key: int, rng: np.random.Generator) -> list[tuple]:
    """`rows` in the order an export that does not sort them may hold: cut per `row[key]`
    (stream or thread) into buffers of _BUFFER_ROWS records each, the buffers in a shuffled
    order. Deterministic for a given rng state."""
    by_key: dict[object, list[tuple]] = {}
    for r in rows:
        by_key.setdefault(r[key], []).append(r)
    buffers: list[list[tuple]] = []
    for k in sorted(by_key, key=lambda v: (v is None, v)):
        own = by_key[k]
        at = 0
        while at < len(own):
            size = int(rng.integers(_BUFFER_ROWS[0], _BUFFER_ROWS[1] + 1))
            buffers.append(own[at:at + size])
            at += size
    order = rng.permutation(len(buffers))
    return [r for i in order for r in buffers[i]]


class NsysSqliteExport:
    """One nsys SQLite export being written from the records of a synthetic timeline.

    `write_rank(rank)` after each pass of the ranks (the rank's finished passes and the host
    records so far; the caller clears them), `finish(facts, ranks)` once at the end. A rank is
    any object with: rank, pid, device, ctx, t (its last host time), passes (each with `ops`:
    GPU activities, and `launches`), graph_execs (graphId -> graphExecId) and the host record
    lists of the module docstring."""

    def __init__(self, path: str | Path, era: SchemaEra, *, seed: int, graph_level: bool):
        self.w = SqliteTraceWriter(path, era)
        self.era = era
        self.graph_level = graph_level  # --cuda-graph-trace=graph: one row per replay
        self._static: dict[str, tuple] = {}
        self._chains: dict[str, int] = {}  # API name -> CUDA_CALLCHAINS id (2022 backtraces)
        self._grid_ids: dict[int, int] = {}  # rank -> last gridId
        # a stream of its own, so the row order never moves the timeline
        self.order_rng = None if era.rows_in_time_order else np.random.default_rng([seed, 0x0DE2])

    @property
    def rows_written(self) -> dict[str, int]:
        return self.w.rows_written

    def sid(self, s: str) -> int:
        return self.w.string_id(s)

    # -- GPU activities ---------------------------------------------------------------------
    def _kernel_static(self, kt: S.KernelType) -> tuple:
        """The launch columns of one kernel (names through StringIds, nsys spelling), and the
        shared-memory carveout it executes with."""
        v = self._static.get(kt.key)
        if v is None:
            used = kt.static_smem + kt.dyn_smem
            executed = next(c for c in _SMEM_CARVEOUTS if c >= used + (1_024 if used else 0)) \
                if used < 232_448 else 233_472
            v = self._static[kt.key] = (
                (self.sid(kt.name_in("nsys")), self.sid(kt.short), self.sid(kt.mangled), 1, 1,
                 kt.regs, *kt.grid, *kt.block, kt.static_smem, kt.dyn_smem, 0, 250_871_808),
                executed)
        return v

    def write_rank(self, rs) -> None:
        w = self.w
        gpid = global_pid(rs.pid)
        gtid = global_tid(rs.pid, rs.pid)  # the scheduler thread is the process main thread
        grid_id = self._grid_ids.get(rs.rank, 1_000)
        krows, crows, grows = [], [], []
        for p in rs.passes:
            if not p.ops:
                continue
            if self.graph_level and p.launches:
                by_corr: dict[int, list] = {}
                for op in p.ops:
                    if op.graph is not None:
                        by_corr.setdefault(op.corr, []).append(op)
                for corr, gops in by_corr.items():
                    # the replay row sits on the stream the graph was launched into
                    grows.append((min(o.start for o in gops), max(o.end for o in gops), rs.device,
                                  rs.ctx, 0, rs.launch_stream, corr, gpid, gops[0].graph,
                                  rs.graph_execs[gops[0].graph]))
            for op in p.ops:
                if op.kind == "c":
                    crows.append((op.start, op.end, rs.device, rs.ctx, 0, op.stream, op.corr,
                                  gpid, op.bytes, 1, op.src_kind, 2, None, 1))
                    continue
                if self.graph_level and op.graph is not None:
                    continue
                st, executed = self._kernel_static(op.kt)
                grid_id += 1
                cl = op.kt.cluster
                krows.append((op.start, op.end, rs.device, rs.ctx, 0, op.stream, op.corr,
                               gpid, *st, grid_id, executed, op.node, 0, op.graph,
                               cl[0], cl[1], cl[2], 1, 8 if cl[0] else 0, 0, "[]"))
        self._grid_ids[rs.rank] = grid_id
        sid = self.sid
        runtime = [(start, end, api_event_class(name), gtid, corr, sid(name), 0)
                   for start, end, name, corr in rs.api_calls]
        syncs = [(start, end, rs.device, rs.ctx, stream, corr, gpid, kind, event, event_sync)
                 for start, end, stream, corr, kind, event, event_sync in rs.syncs]
        if self.order_rng is not None:
            rng = self.order_rng
            krows = _buffer_interleaved(krows, KERNEL_COLS.index("streamId"), rng)
            crows = _buffer_interleaved(crows, MEMCPY_COLS.index("streamId"), rng)
            grows = _buffer_interleaved(grows, GRAPH_TRACE_COLS.index("streamId"), rng)
            runtime = _buffer_interleaved(runtime, RUNTIME_COLS.index("globalTid"), rng)
            syncs = _buffer_interleaved(syncs, SYNC_COLS.index("streamId"), rng)
        if krows:
            w.insert("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL_COLS, krows)
        if crows:
            w.insert("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_COLS, crows)
        if grows:
            w.insert("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", GRAPH_TRACE_COLS, grows)
        if runtime:
            w.insert("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLS, runtime)
            if self.era.backtrace_rows:
                w.insert("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLS + ("callchainId",),
                         self._backtrace_rows(runtime))
        if rs.nvtx:
            w.insert("NVTX_EVENTS", NVTX_COLS,
                     [(start, end, NVTX_PUSHPOP, text, gtid, 0) for start, end, text in rs.nvtx])
        if syncs:
            w.insert("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", SYNC_COLS, syncs)
        if rs.node_events and not self.graph_level:
            w.insert(self.era.graph_node_table, NODE_EVENT_COLS,
                     [(start, end, EC_NODE_CREATE, gtid, sid(api), node, original)
                      for start, end, api, node, original in rs.node_events])
        if rs.graph_events and self.era.graph_event_table:  # no graph-level table up to 2023.3
            rows = []
            for t, kind, graph, graph_exec in rs.graph_events:
                event_class, name = _GRAPH_EVENT[kind]
                rows.append((t, t, event_class, gtid, sid(name), graph, None, graph_exec))
            w.insert(self.era.graph_event_table, GRAPH_EVENT_COLS, rows)

    def _backtrace_rows(self, runtime: list[tuple]) -> list[tuple]:
        """What a 2022 export with CUDA backtraces holds besides each runtime call (eventClass
        0): an eventClass 67 row with the same correlationId and the unversioned name, starting a
        little earlier and ending a little later (as in the real 2022.2 export), pointing at a
        callchain. The offsets come from the correlationId, so the rank's random stream (and the
        timeline) stays the same in every era."""
        rows = []
        for start, end, event_class, gtid, corr, name_id, ret in runtime:
            if event_class != 0:
                continue
            name = _VERSION_SUFFIX.sub("", self.w.string_value(name_id))
            rows.append((start - 150 - corr * 37 % 250, end + 70 + corr * 53 % 380, EC_BACKTRACE,
                         gtid, corr, self.sid(name), ret, self._callchain(name)))
        return rows

    def _callchain(self, api: str) -> int:
        """One CUDA_CALLCHAINS chain per API name (nsys keeps one per call; the importer reads
        none): the API in libcudart, called from the Python interpreter."""
        chain = self._chains.get(api)
        if chain is None:
            chain = self._chains[api] = len(self._chains) + 1
            w = self.w
            w.insert("CUDA_CALLCHAINS", ("id", "symbol", "module", "unresolved", "originalIP",
                                         "stackDepth"),
                     [(chain, w.string_id(api), w.string_id("libcudart.so.11.0"), 0,
                       0x7F3A_1C00_0000 + chain * 0x1F40, 0),
                      (chain, w.string_id("_PyEval_EvalFrameDefault"),
                       w.string_id("libpython3.10.so.1.0"), 0, 0x7F3A_5E21_7A3C, 1)])
        return chain

    # -- the rest of the export ---------------------------------------------------------------
    def finish(self, facts: CaptureFacts, ranks: list, *, vacuum: bool = False) -> None:
        """Metadata and target tables, enums, StringIds; closes the file."""
        _write_static_tables(self.w, facts, ranks)
        self.w.write_enums()
        self.w.close(vacuum=vacuum)


def _write_static_tables(w: SqliteTraceWriter, cfg: CaptureFacts, rks: list) -> None:
    era = w.era
    last = max(rs.t for rs in rks) + 50_000_000
    start_time = cfg.session_start
    graph_mode = cfg.mode == "graph"
    export_meta = [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
        ("EXPORT_PRODUCT_VERSION", era.product_version),
        ("EXPORT_PRODUCT_DATE", era.product_date),
        ("EXPORT_SCHEMA_VERSION", era.schema_version),
        *zip(("EXPORT_SCHEMA_VERSION_MAJOR", "EXPORT_SCHEMA_VERSION_MINOR",
              "EXPORT_SCHEMA_VERSION_MICRO"), era.schema_version.split(".")),
        ("EXPORT_PLATFORM", "linux-desktop"),
        ("EXPORT_ARCH", "x64"),
        ("EXPORT_TIME_UTC", "2026-06-01T08:00:00"),
        ("EXPORT_TIME_LOCAL", "2026-06-01T08:00:00 +0000 UTC"),
        ("EXPORT_HOST", "nsys-ledger-synth"),
        ("EXPORT_USER", "synth"),
        ("EXPORT_PARAM_EXPORT_TYPE", "SQLite"),
        ("EXPORT_PARAM_INPUT_FILE", "nsys-ledger-synth"),
        ("EXPORT_PARAM_OUTPUT_FILE", Path(w.path).name),
        ("EXPORT_PARAM_OVERWRITE", "true"),
        ("EXPORT_PARAM_APPEND", "false"),
        ("EXPORT_PARAM_LAZY", "true"),
        ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
        ("EXPORT_PARAM_TIME_SHIFT", "0"),
        ("EXPORT_CONFIG_TIME_SHIFT", "0"),
        ("DERIVED_FROM", "reference schedule glm-5.3 decode (nsys_ledger.synth.schedule)"),
        ("DERIVED_BY", "nsys_ledger.synth.generate: SYNTHETIC trace, not a capture "
                       f"(mode={cfg.mode}, steps={cfg.steps}, ranks={cfg.ranks}, "
                       f"batch={cfg.batch}, seed={cfg.seed}, "
                       f"faults={','.join(sorted(cfg.faults))})"),
    ]
    if era.version_table:  # EXPORT_META_DATA up to 2023.2; 2021 exports say nothing
        w.write_meta(era.version_table, export_meta)
    gmode = ("Graph" if cfg.cuda_graph_trace == "graph" else "Node") if graph_mode else "Node"
    cap = [("DEVICE_ID", "Local (CLI)"), ("CAPTURE_EVENT_TYPE", "NvtxEvents"),
           ("CAPTURE_EVENT_TYPE", "Cuda"), ("RATE_HZ", "0"), ("START_TRIGGER", "Immediate"),
           ("STOP_TRIGGER", "Delayed"), ("DEVICE_TYPE", "Unix"),
           ("DEVICE_DISPLAY_NAME", "nsys-ledger-synth")]
    cap += [(k, gmode) for k in era.graph_mode_keys]
    args = ["-m", "sglang.launch_server", "--model-path", "zai-org/GLM-5.3-FP8", "--tp", "8",
            "--ep", "8", "--moe-a2a-backend", "deepep", "--kv-cache-dtype", "fp8_e4m3",
            "--enable-layerwise-nvtx-marker"]
    if not graph_mode:
        args.append("--disable-cuda-graph")
    cap += [("CUDA_TRACE_SCOPE", "ProcessTree"), ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
            ("PROCESS_0:COMMAND", "python3")]
    cap += [(f"PROCESS_0:ARGUMENT_{i}", a) for i, a in enumerate(args)]
    cap += [("PROCESS_0:COLLECT_NVTX_TRACE", "true"), ("PROCESS_0:COLLECT_CUDA_TRACE", "true"),
            ("TRACE_AFTER_FORK_BEFORE_EXEC", "true"),
            ("RUN_DURATION_MS", str((last - start_time) // 1_000_000))]
    if era.has("META_DATA_CAPTURE"):  # from 2023.3
        w.write_meta("META_DATA_CAPTURE", cap)
    w.insert("ANALYSIS_DETAILS", ("globalVid", "duration", "startTime", "stopTime"),
             [(VM_BITS, last - start_time, start_time, last)])
    w.insert("TARGET_INFO_SESSION_START_TIME",
             ("utcEpochNs", "utcTime", "localTime", "systemClockNs"),
             [(1_780_300_800_000_000_000, "2026-06-01T08:00:00", "2026-06-01T08:00:00",
               start_time)])
    launcher = cfg.launcher_pid
    procs = [(VM_BITS | (launcher << 24), launcher, "python3")]
    procs += [(global_pid(rs.pid), rs.pid, f"sglang::scheduler_TP{rs.rank}") for rs in rks]
    w.insert("PROCESSES", ("globalPid", "pid", "name"), procs)
    tn = [(w.string_id("python3"), 20, global_tid(launcher, launcher))]
    for rs in rks:
        for off, name in ((0, "sglang::schedul"), (5, "[NSys]"), (6, "[NSys Comms]"),
                          (9, "cuda00001800007"), (11, "CUPTI worker th"),
                          (13, "cuda-EvtHandlr"), (21, "python3"), (27, "pt_nccl_watchdg")):
            tn.append((w.string_id(name), 20, global_tid(rs.pid, rs.pid + off)))
    w.insert("ThreadNames", ("nameId", "priority", "globalTid"), tn)
    streams = []
    for rs in rks:
        for sid, prio, flag in cfg.streams:
            streams.append((sid, 0, 1, rs.pid, rs.ctx, prio, flag))
    w.insert("TARGET_INFO_CUDA_STREAM",
             ("streamId", "hwId", "vmId", "processId", "contextId", "priority", "flag"), streams)
    gpus = []
    for rs in rks:
        gpus.append((VM_BITS, rs.device, "NVIDIA H200", f"0000:{0x18 + 0x11 * rs.device:02x}:00.0",
                     1, 52_428_800, 150_754_820_096, 4_800_000_000_000, 1_980_000_000, 132, 0,
                     f"5f1c{rs.device:04x}-3a2e-9c41-77d0-8e2b6a41c0{rs.device:02x}", 0, "GH100",
                     rs.device, None, None, 161, 0, 65_536, 4, 65_536, 49_152, 232_448,
                     233_472, 65_536, 32, 5, 64, 32, 1_024, 1_024, 1_024, 64, 2_147_483_647,
                     65_535, 65_535, 9, 0, 9, 0))
    gpu_cols = ("vmId", "id", "name", "busLocation", "isDiscrete", "l2CacheSize", "totalMemory",
                "memoryBandwidth", "clockRate", "smCount", "pwGpuId", "uuid", "luid", "chipName",
                "cuDevice", "ctxswDevPath", "ctrlDevPath", "revision", "nodeMask",
                "constantMemory", "maxIPC", "maxRegistersPerBlock", "maxShmemPerBlock",
                "maxShmemPerBlockOptin", "maxShmemPerSm", "maxRegistersPerSm", "threadsPerWarp",
                "asyncEngines", "maxWarpsPerSm", "maxBlocksPerSm", "maxThreadsPerBlock",
                "maxBlockDimX", "maxBlockDimY", "maxBlockDimZ", "maxGridDimX", "maxGridDimY",
                "maxGridDimZ", "computeMajor", "computeMinor", "smMajor", "smMinor")
    if era.gpu_table == "TARGET_INFO_GPU":
        w.insert("TARGET_INFO_GPU", gpu_cols, gpus)
    else:
        _write_cuda_gpu_table(w, rks)
    if era.has("TARGET_INFO_CUDA_DEVICE"):
        w.insert("TARGET_INFO_CUDA_DEVICE", ("gpuId", "cudaId", "pid"),
                 [(rs.device, rs.device, rs.pid) for rs in rks])
    if era.has("TARGET_INFO_CUDA_CONTEXT_INFO"):
        w.insert("TARGET_INFO_CUDA_CONTEXT_INFO",
                 ("nullStreamId", "hwId", "vmId", "processId", "deviceId", "contextId",
                  "parentContextId", "isGreenContext"),
                 [(cfg.null_stream, 0, 1, rs.pid, rs.device, rs.ctx, 0, 0) for rs in rks])


def _write_cuda_gpu_table(w: SqliteTraceWriter, rks: list) -> None:
    """TARGET_INFO_CUDA_GPU of exports before 2021.4: the same H200, in CUPTI's device-record
    names (see synth/schema_eras.py)."""
    cols = ("deviceId", "name", "uuid", "computeCapabilityMajor", "computeCapabilityMinor",
            "numMultiprocessors", "numThreadsPerWarp", "maxWarpsPerMultiprocessor",
            "maxBlocksPerMultiprocessor", "maxThreadsPerBlock", "maxRegistersPerBlock",
            "maxSharedMemoryPerBlock", "globalMemorySize", "globalMemoryBandwidth", "l2CacheSize",
            "coreClockRate", "maxIPC")
    w.insert("TARGET_INFO_CUDA_GPU", cols, [
        (rs.device, "NVIDIA H200", f"5f1c{rs.device:04x}-3a2e-9c41-77d0-8e2b6a41c0{rs.device:02x}",
         9, 0, 132, 32, 64, 32, 1_024, 65_536, 49_152, 150_754_820_096, 4_800_000_000, 52_428_800,
         1_980_000, 4)
        for rs in rks])
