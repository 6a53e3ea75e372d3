"""The PyTorch profiler (Kineto) format of a synthetic timeline: one gzip Chrome-trace JSON.

The timeline (synth/generate.py) hands over the same format-free records as to the nsys
SQLite writer (synth/nsys_sqlite.py): GPU activities with stream, launch correlation and
graph node, host API calls by name, the layer-wise NVTX ranges, syncs. This module writes
what `torch.profiler` with CUDA activities records of that run, in the event shapes of the
real traces in shared/real_traces/kineto/ (CUPTI, libkineto):

* `kernel` (pid = device, tid = stream; args: queued, device, context, stream, correlation,
  registers per thread, shared memory, blocks per SM, warps per SM, grid, block,
  est. achieved occupancy %), named in GNU c++filt spelling (`2112u`, `true`, `> >`), as
  the profiler demangles with the C++ ABI, not nsys's demangler;
* `gpu_memcpy` `Memcpy HtoD (Pinned -> Device)` / `(Pageable -> Device)` with bytes and
  bandwidth; `cuda_runtime` / `cuda_driver` calls by their unversioned name with `cbid` and
  `correlation` (CUPTI's callback ids); `ac2g` flows from each launch to its GPU rows;
* kernels replayed from a CUDA graph carry the correlation id of their `cudaGraphLaunch`
  (CUPTI gives graph kernels the launch's id) and no External id: `CUDAGraph.replay` is not
  an ATen op, so no cpu_op encloses the launch (as in the real SGLang replay trace);
* the H2D copies inside `aten::copy_` cpu ops (External id shared with the memcpy call and
  the copy);
* each scheduler iteration as SGLang's `record_function` ranges (user_annotation
  `execute_{bs}_context_..._generation_...` around `step[DECODE bs=32]`), and the same
  ranges on the GPU (gpu_user_annotation, spanning the iteration's GPU work);
* `with_modules` module ranges (python_function `nn.Module: DeepseekV2DecoderLayer_12`) for
  every forward pass the host runs module by module (eager decode, prefill): SGLang's own
  layer-wise NVTX text never reaches a torch trace; a CUDA-graph replay runs no module code,
  so replayed decode steps have no module range at all (the ranges follow the timeline's
  layer-wise module ranges: with `layerwise_nvtx=False` the trace has none, as a profile taken
  without `with_modules`);
* `deviceProperties` (eight H200s: the TP8 node), `distributedInfo` (rank, world size 8),
  process and thread names.

The profile window is the serving loop (SGLang's `/start_profile`): start-up, the warm-up
pass and the CUDA-graph capture happen before any request and are not in the trace; the
prefill and every decode step are. Times are written as µs with three decimals (exact ns,
relative to `baseTimeNanoseconds`).

What a real trace has and this one has not: the ATen cpu_op around each eager kernel launch
(the schedule names kernels, not the Python ops that launch them), Python stacks, memory
events. The checker needs none of them.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from pathlib import Path

import msgspec

from nsys_ledger.synth import schedule as S

# CUPTI callback ids (cupti_runtime_cbid.h / cupti_driver_cbid.h) of the calls the timeline
# makes inside the profile window; libkineto writes them as `args.cbid`.
RUNTIME_CBIDS = {
    "cudaMemcpyAsync": 41, "cudaStreamSynchronize": 131, "cudaEventRecord": 135,
    "cudaEventSynchronize": 137, "cudaStreamWaitEvent": 147, "cudaDeviceSynchronize": 165,
    "cudaLaunchKernel": 211, "cudaGraphLaunch": 311, "cudaStreamBeginCapture": 316,
    "cudaStreamEndCapture": 318, "cudaGraphInstantiateWithFlags": 418,
    "cudaLaunchKernelExC": 430,
}
DRIVER_CBIDS = {"cuLaunchKernel": 307, "cuLaunchKernelEx": 652, "cuGraphLaunch": 514}
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_MODULE_PATH = re.compile(r"'Module': '([^']+)'")

H200 = {"name": "NVIDIA H200", "totalGlobalMem": 150_754_820_096, "computeMajor": 9,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
        "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
        "sharedMemPerMultiprocessor": 233472}
NODE_GPUS = 8  # TP8 + EP8 on one node: every rank's profiler lists the node's eight GPUs
CONTEXT = 1  # the primary context, as CUPTI numbers it in a one-GPU-per-process run
# baseTimeNanoseconds: the epoch time that the trace's timestamps count from (the session
# start on the trace clock is 2026-06-01T08:00:00 UTC, as in the SQLite twin's metadata)
BASE_TIME_NS = 1_780_300_800_000_000_000 - 41_203_517_112

# SGLang's GLM-5.3 model (GlmMoeDsaForCausalLM subclasses DeepseekV2ForCausalLM and builds
# DeepseekV2 layers): the class of each module path, for `nn.Module: <Class>_<n>`.
_ROOT_CLASSES = {"model": "GlmMoeDsaForCausalLM", "model.model": "DeepseekV2Model",
                 "model.model.embed_tokens": "VocabParallelEmbedding",
                 "model.model.norm": "RMSNorm", "model.logits_processor": "LogitsProcessor"}
_LAYER_CLASSES = {
    "": "DeepseekV2DecoderLayer", "input_layernorm": "RMSNorm",
    "post_attention_layernorm": "RMSNorm", "self_attn": "DeepseekV2AttentionMLA",
    "self_attn.fused_qkv_a_proj_with_mqa": "ReplicatedLinear",
    "self_attn.q_a_layernorm": "RMSNorm", "self_attn.kv_a_layernorm": "RMSNorm",
    "self_attn.q_b_proj": "ColumnParallelLinear", "self_attn.o_proj": "RowParallelLinear",
    "self_attn.rotary_emb": "DeepseekScalingRotaryEmbedding",
    "self_attn.attn_mqa": "RadixAttention", "self_attn.indexer": "Indexer",
    "self_attn.indexer.wq_b": "ReplicatedLinear", "self_attn.indexer.wk": "ReplicatedLinear",
    "self_attn.indexer.k_norm": "LayerNorm", "mlp.gate": "MoEGate", "mlp.topk": "TopK",
    "mlp.experts": "DeepEPMoE", "mlp.shared_experts": "DeepseekV2MLP",
    "mlp.shared_experts.gate_up_proj": "MergedColumnParallelLinear",
    "mlp.shared_experts.down_proj": "RowParallelLinear",
    "mlp.gate_up_proj": "MergedColumnParallelLinear", "mlp.down_proj": "RowParallelLinear",
    "mlp.act_fn": "SiluAndMul",
}
_LAYER_PATH = re.compile(r"^model\.model\.layers\.(\d+)\.?(.*)$")


def module_class(path: str, moe_layer: bool) -> str:
    """The Python class of SGLang's module at `path` (`model.model.layers.12.self_attn`)."""
    if path in _ROOT_CLASSES:
        return _ROOT_CLASSES[path]
    m = _LAYER_PATH.match(path)
    if not m:
        return "Module"
    rel = m.group(2)
    if rel == "mlp":  # the MoE layers' mlp is a DeepseekV2MoE, the dense layers' an MLP
        return "DeepseekV2MoE" if moe_layer else "DeepseekV2MLP"
    return _LAYER_CLASSES.get(rel, "Module")


def us(ns: int) -> float:
    """Nanoseconds as Kineto's µs: the nearest double to ns / 1000, whose shortest text has at
    most three decimals, so a reader gets the integer ns back exactly."""
    return ns / 1000


def _occupancy(kt, sms: int) -> tuple[float, float, int]:
    """blocks per SM, warps per SM and the occupancy estimate libkineto writes for a kernel:
    the resident warps an SM can hold for its block size, registers and shared memory, of the
    64 warps an H200 SM holds, limited by how many blocks the grid has per SM."""
    blocks = kt.grid[0] * kt.grid[1] * kt.grid[2]
    threads = kt.block[0] * kt.block[1] * kt.block[2]
    warps_per_block = max(1, -(-threads // 32))
    per_sm = 32
    per_sm = min(per_sm, 64 // warps_per_block)
    if kt.regs:
        per_sm = min(per_sm, 65536 // max(1, kt.regs * warps_per_block * 32))
    smem = kt.static_smem + kt.dyn_smem
    if smem:
        per_sm = min(per_sm, 233472 // smem)
    blocks_per_sm = blocks / sms
    resident = min(per_sm, -(-blocks // sms))
    occupancy = round(100 * resident * warps_per_block / 64)
    return round(blocks_per_sm, 6), round(blocks_per_sm * warps_per_block, 6), min(100, occupancy)


class KinetoTraceExport:
    """One Kineto trace being written from the records of a synthetic timeline: the same
    interface as NsysSqliteExport (`write_rank` after each pass, `finish` once)."""

    def __init__(self, path: str | Path, *, seed: int):
        self.path = Path(path)
        self.seed = seed
        self.host: list[dict] = []  # user_annotation, cpu_op, python_function
        self.gpu: list[dict] = []  # kernel, gpu_memcpy, gpu_user_annotation, ac2g ends
        self.calls: list[dict] = []  # cuda_runtime, cuda_driver, ac2g starts
        self.window_start: dict[int, int] = {}  # rank -> host time the profiler started
        self.last_time: dict[int, int] = {}
        self.external_id = 0
        self.python_id = 0
        self.module_ids: dict[str, int] = {}  # module path -> instance number of its class
        self.class_counts: Counter = Counter()
        self.moe_mlp_paths: dict[str, bool] = {}  # `...layers.N.mlp` -> has a router child
        self.kv_tokens = 0  # per request, grows by one token per decode step
        self.ranks: list = []

    @property
    def rows_written(self) -> dict[str, int]:
        """Events written per category (`ac2g` flows included; process and thread names and
        the profiler's own span events, written by `finish`, are not)."""
        counts = Counter(e.get("cat", "metadata") for part in (self.host, self.gpu, self.calls)
                         for e in part)
        return dict(sorted(counts.items()))

    def _next_external_id(self) -> int:
        self.external_id += 1
        return self.external_id

    # -- one flush of a rank ----------------------------------------------------------------
    def write_rank(self, rs) -> None:
        served = [p for p in rs.passes if p.label in ("prefill", "decode")]
        start = self.window_start.get(rs.rank)
        if start is None:
            if not served:
                return  # start-up, warm-up, capture: before the profiler was started
            start = self._iteration_start(rs, served[0])
            self.window_start[rs.rank] = start
            self.ranks.append(rs)
        calls = [c for c in rs.api_calls if c[0] >= start]
        ranges = [r for r in rs.nvtx if r[0] >= start]
        ops = [op for p in served for op in p.ops]
        if not (calls or ops):
            return
        pid = rs.pid
        copy_ids = self._copy_ops(rs, calls, served)
        self._api_calls(rs, calls, copy_ids, {op.corr for op in ops})
        self._gpu_ops(rs, ops, copy_ids)
        self._module_ranges(pid, ranges)
        for p in served:
            self._iteration_ranges(rs, p, calls, ranges)
        self.last_time[rs.rank] = max([c[1] for c in calls] + [r[1] for r in ranges]
                                      + [self.last_time.get(rs.rank, start)])

    @staticmethod
    def _iteration_start(rs, first) -> int:
        """Host time of the first record of the first served pass: its first launch call (the
        first copy's cudaMemcpyAsync) or an NVTX range opened before it. The same flush may
        hold the start-up calls (eager mode), all of which come earlier."""
        first_corr = min(op.corr for op in first.ops)
        launch = min(c[0] for c in rs.api_calls if c[3] == first_corr)
        return min([launch] + [r[0] for r in rs.nvtx if r[0] <= launch <= r[1]])

    def _copy_ops(self, rs, calls: list[tuple], served: list) -> dict[int, int]:
        """`aten::copy_` around each H2D cudaMemcpyAsync (torch `Tensor.copy_` / `.to(device,
        non_blocking=True)` of the scheduler's metadata): correlation -> External id."""
        copies = {op.corr: op for p in served for op in p.copies}
        ids: dict[int, int] = {}
        for start, end, name, corr in calls:
            op = copies.get(corr)
            if op is None:
                continue
            ext = ids[corr] = self._next_external_id()
            # the op's own work before and after the runtime call (from the id: deterministic
            # without drawing from the timeline's random stream)
            before, after = 900 + corr * 37 % 700, 400 + corr * 53 % 500
            self.host.append({
                "ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": rs.pid, "tid": rs.pid,
                "ts": us(start - before), "dur": us(end - start + before + after),
                "args": {"External id": ext, "Record function id": 0,
                         "Concrete Inputs": ["", "", "True"],
                         "Input type": ["int" if op.bytes % 8 else "long int",
                                        "long int", "Scalar"],
                         "Input Strides": [[1], [1], []],
                         "Input Dims": [[op.bytes // 8], [op.bytes // 8], []]}})
        return ids

    def _api_calls(self, rs, calls: list[tuple], copy_ids: dict[int, int],
                   gpu_corrs: set[int]) -> None:
        for start, end, name, corr in calls:
            plain = _VERSION_SUFFIX.sub("", name)
            driver = plain.startswith("cu") and not plain.startswith("cuda")
            cbid = (DRIVER_CBIDS if driver else RUNTIME_CBIDS).get(plain)
            args: dict = {}
            if corr in copy_ids:
                args["External id"] = copy_ids[corr]
            if cbid is not None:
                args["cbid"] = cbid
            args["correlation"] = corr
            ts = us(start)
            self.calls.append({"ph": "X", "cat": "cuda_driver" if driver else "cuda_runtime",
                               "name": plain, "pid": rs.pid, "tid": rs.pid, "ts": ts,
                               "dur": us(end - start), "args": args})
            if corr in gpu_corrs:  # the launch end of the launch -> GPU arrow
                self.calls.append({"ph": "s", "id": corr, "pid": rs.pid, "tid": rs.pid,
                                   "ts": ts, "cat": "ac2g", "name": "ac2g"})

    def _gpu_ops(self, rs, ops: list, copy_ids: dict[int, int]) -> None:
        sms = H200["numSms"]
        for op in sorted(ops, key=lambda o: (o.start, o.stream)):
            ts = us(op.start)
            dur = op.end - op.start
            if op.kind == "c":
                source = "Pinned" if op.src_kind == 1 else "Pageable"
                self.gpu.append({
                    "ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy HtoD ({source} -> Device)",
                    "pid": rs.device, "tid": op.stream, "ts": ts, "dur": us(dur),
                    "args": {"External id": copy_ids[op.corr], "device": rs.device,
                             "context": CONTEXT, "stream": op.stream, "correlation": op.corr,
                             "bytes": op.bytes,
                             "memory bandwidth (GB/s)": op.bytes / max(dur, 1)}})
            else:
                kt = op.kt
                blocks_per_sm, warps_per_sm, occupancy = _occupancy(kt, sms)
                self.gpu.append({
                    "ph": "X", "cat": "kernel", "name": kt.name_in("cxxfilt"),
                    "pid": rs.device, "tid": op.stream, "ts": ts, "dur": us(dur),
                    "args": {"queued": 0, "device": rs.device, "context": CONTEXT,
                             "stream": op.stream, "correlation": op.corr,
                             "registers per thread": kt.regs,
                             "shared memory": kt.static_smem + kt.dyn_smem,
                             "blocks per SM": blocks_per_sm, "warps per SM": warps_per_sm,
                             "grid": list(kt.grid), "block": list(kt.block),
                             "est. achieved occupancy %": occupancy}})
            self.gpu.append({"ph": "f", "id": op.corr, "pid": rs.device, "tid": op.stream,
                             "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def _module_ranges(self, pid: int, ranges: list[tuple]) -> None:
        """python_function `nn.Module: <Class>_<n>` events, nested as the NVTX ranges are; n
        counts the instances of a class in the order the profiler first meets them (so layer
        12's decoder layer is `DeepseekV2DecoderLayer_12`)."""
        stack: list[tuple[int, int]] = []  # (end, python id) of the open ranges
        for start, end, text in sorted(ranges, key=lambda r: (r[0], -r[1])):
            m = _MODULE_PATH.search(text)
            if not m:
                continue
            path = m.group(1)
            while stack and stack[-1][0] <= start:
                stack.pop()
            parent = stack[-1][1] if stack else None
            cls = module_class(path, moe_layer=self._is_moe_mlp(path, ranges))
            if path not in self.module_ids:
                self.module_ids[path] = self.class_counts[cls]
                self.class_counts[cls] += 1
            self.python_id += 1
            self.host.append({
                "ph": "X", "cat": "python_function",
                "name": f"nn.Module: {cls}_{self.module_ids[path]}", "pid": pid, "tid": pid,
                "ts": us(start), "dur": us(end - start),
                "args": {"Python parent id": parent, "Python id": self.python_id,
                         "Python module id": self.module_ids[path]}})
            stack.append((end, self.python_id))

    def _is_moe_mlp(self, path: str, ranges: list[tuple]) -> bool:
        """Whether the `mlp` at `path` is a MoE block: it has a router (`mlp.gate`) child."""
        if not path.endswith(".mlp"):
            return False
        found = self.moe_mlp_paths.get(path)
        if found is None:
            gate = f"'Module': '{path}.gate'"
            found = self.moe_mlp_paths[path] = any(gate in r[2] for r in ranges)
        return found

    def _iteration_ranges(self, rs, p, calls: list[tuple], ranges: list[tuple]) -> None:
        """SGLang's record_function ranges of one scheduler iteration (host), and their GPU
        projection (gpu_user_annotation over the iteration's GPU work)."""
        corrs = {op.corr for op in p.ops}
        mine = [c for c in calls if c[3] >= min(corrs)]
        host_start = min([c[0] for c in mine] + [r[0] for r in ranges if r[0] <= mine[0][0]])
        host_end = max([c[1] for c in mine] + [r[1] for r in ranges])
        bs = rs.cfg.batch
        if p.label == "prefill":
            per_request = S.PREFILL_TOKENS_PER_REQ
            tokens = bs * per_request
            outer = (f"execute_{bs}_context_{bs}(sq{tokens}sk{tokens}"
                     f"sqsq{bs * per_request ** 2}sqsk{bs * per_request ** 2})"
                     "_generation_0(sq0sk0sqsq0sqsk0)")
            inner = f"step[EXTEND bs={bs}]"
            self.kv_tokens = per_request
        else:
            self.kv_tokens += 1
            kv = bs * self.kv_tokens
            outer = f"execute_{bs}_context_0(sq0sk0sqsq0sqsk0)_generation_{bs}(sq{bs}sk{kv}sqsq{bs}sqsk{kv})"
            inner = f"step[DECODE bs={bs}]"
        gpu_start = min(op.start for op in p.ops)
        gpu_end = max(op.end for op in p.ops)
        # drawn on the stream of the iteration's first GPU work, as the profiler does
        main_stream = min(p.ops, key=lambda op: op.start).stream
        for name, lead, trail in ((outer, 1_800, 900), (inner, 1_100, 500)):
            ext = self._next_external_id()
            self.host.append({
                "ph": "X", "cat": "user_annotation", "name": name, "pid": rs.pid,
                "tid": rs.pid, "ts": us(host_start - lead), "dur": us(host_end - host_start
                                                                         + lead + trail),
                "args": {"External id": ext, "Record function id": 0}})
            self.gpu.append({
                "ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": rs.device,
                "tid": main_stream, "ts": us(gpu_start), "dur": us(gpu_end - gpu_start),
                "args": {"External id": ext}})

    # -- the file -------------------------------------------------------------------------
    def finish(self, facts, ranks: list, *, vacuum: bool = False) -> None:
        """Process and thread names, the device list, and the gzip JSON file (deterministic:
        no time stamp in the gzip header)."""
        del vacuum  # an SQLite notion
        meta: list[dict] = []
        for rs in self.ranks:
            t = us(self.window_start[rs.rank])
            meta += [
                {"name": "process_name", "ph": "M", "ts": t, "pid": rs.pid, "tid": 0,
                 "args": {"name": f"sglang::scheduler_TP{rs.rank}"}},
                {"name": "process_labels", "ph": "M", "ts": t, "pid": rs.pid, "tid": 0,
                 "args": {"labels": "CPU"}},
                {"name": "process_sort_index", "ph": "M", "ts": t, "pid": rs.pid, "tid": 0,
                 "args": {"sort_index": rs.pid}},
                {"name": "thread_name", "ph": "M", "ts": t, "pid": rs.pid, "tid": rs.pid,
                 "args": {"name": f"thread {rs.pid} (sglang::schedul)"}},
                {"name": "thread_sort_index", "ph": "M", "ts": t, "pid": rs.pid, "tid": rs.pid,
                 "args": {"sort_index": rs.pid}},
            ]
            for device in range(NODE_GPUS):
                meta += [
                    {"name": "process_name", "ph": "M", "ts": t, "pid": device, "tid": 0,
                     "args": {"name": "python3"}},
                    {"name": "process_labels", "ph": "M", "ts": t, "pid": device, "tid": 0,
                     "args": {"labels": f"GPU {device}"}},
                    {"name": "process_sort_index", "ph": "M", "ts": t, "pid": device, "tid": 0,
                     "args": {"sort_index": 5_000_000 + device}},
                ]
            streams = sorted({e["tid"] for e in self.gpu if e.get("pid") == rs.device})
            for stream in streams:
                meta += [
                    {"name": "thread_name", "ph": "M", "ts": t, "pid": rs.device, "tid": stream,
                     "args": {"name": f"stream {stream} "}},
                    {"name": "thread_sort_index", "ph": "M", "ts": t, "pid": rs.device,
                     "tid": stream, "args": {"sort_index": stream}},
                ]
        first = min(self.window_start.values(), default=0)
        last = max(self.last_time.values(), default=first)
        span = [{"ph": "X", "cat": "Trace", "ts": us(first), "dur": us(last - first),
                 "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
                 "args": {"Op count": 0}},
                {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",
                 "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": us(first)},
                {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                 "ts": us(last + 20_000)}]
        rank = ranks[0].rank if ranks else 0
        head = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": d, **H200} for d in range(NODE_GPUS)],
            "cupti_version": 26, "cuda_runtime_version": 12080, "cuda_driver_version": 12080,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": NODE_GPUS},
            "record_shapes": 1,
            # module ranges come from the timeline's layer-wise ranges: none without them
            **({"with_modules": 1} if self.module_ids else {}),
            "trace_id": f"{self.seed:016X}{rank:016X}",
            "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_TIME_NS,
        }
        host = sorted(self.host, key=lambda e: e["ts"])
        events = host + self.gpu + self.calls + meta + span
        encode = msgspec.json.Encoder().encode
        text = msgspec.json.encode(head)[:-1] + b', "traceEvents": [\n  ' + \
            b",\n  ".join(map(encode, events)) + \
            b'\n], "traceName": ' + encode(self.path.name) + b"}\n"
        self.path.write_bytes(gzip.compress(text, compresslevel=6, mtime=0))

