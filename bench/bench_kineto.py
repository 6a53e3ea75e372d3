"""Benchmark: `check` of a big PyTorch profiler (Kineto) trace against a bare JSON parse of it.

Writes (once, cached in bench/out/) a synthetic SGLang-style decode profile in the Chrome trace
format the PyTorch profiler writes, gzip-compressed like SGLang's `*.trace.json.gz`:

* graph mode: per decode step an `execute_32_context_0(...)_generation_32(...)` annotation, a
  few aten cpu ops, three H2D copies (`cudaMemcpyAsync` + `gpu_memcpy` + `ac2g` flow), one
  `cudaGraphLaunch` whose ~2000 kernels carry its correlation id, and the sampling kernel
  launched eagerly (`cudaLaunchKernel`);
* eager mode: the same steps with every kernel launched on its own under an aten cpu op, with
  its `ac2g` flow pair (five events per kernel).

Timestamps are µs with three decimals on a large absolute clock (4.9e12 µs), as in real files.
`--modes synth` takes the trace of `nsys-ledger synth --format kineto` instead (GLM-5.3 decode,
2,077 kernels per step: 500 steps are the issue's 1M-kernel trace, 619 MB of JSON).
Then, each case in a fresh process (so its peak RSS is its own), it measures:

* bare parse: gunzip + `json.loads` (standard library), `orjson.loads` and `msgspec.json.decode`
  (untyped) of the same file, with the cyclic GC paused: the floor any reader pays;
* baseline: gunzip + a typed msgspec decode of every event's ph/cat/name/ts/dur (the issue's
  floor for the target: `check` + JSON within 2x of it);
* read: `load_trace` (the Kineto reader: streamed, typed msgspec decoding, columns), the
  import of the package included;
* import: only `from nsys_ledger.trace import load_trace` (the package's import: the share of
  `read` that is not reading);
* check: `nsys_ledger.check` without a ledger (steps from the annotations, ops, layers, gaps,
  H2D, graph replays);
* check + JSON: `nsys-ledger check trace.json.gz --json out.json`, the whole CLI process;
* capped: `load_trace` with its data segment limited (RLIMIT_DATA) to what it held after a
  warm-up plus 3/4 of the JSON's size, on a `with_stack`-like trace (ten python_function events
  per kernel, which become no frame): the streaming reader reads it, a reader that holds the
  text cannot (`--capped` also runs the reader's whole-document path, `_collect_whole`, under
  the same cap).

Prints median seconds (of `--repeat` fresh processes), peak RSS and ratios, and writes
bench/out/kineto_results.json.

    python bench/bench_kineto.py                       # 1M kernels, graph mode
    python bench/bench_kineto.py --kernels 100k --modes graph,eager
    python bench/bench_kineto.py --modes synth --repeat 3 --capped 100k
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"

BASE_US = 4_909_914_216_204  # a real trace's clock (µs since boot of the profiled machine)
LAYERS = 36
# kernel names of one decoder layer (SGLang Qwen3 on MI300X, from the real trace's names)
LAYER_KERNELS = (
    "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_dii",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
    "at::native::elementwise_kernel_manual_unroll<128, 4>",
    "_ZN7sgl_hip17rotary_embedding_kernelI14__hip_bfloat16EEvPKlPT_S5_PKS4_iillii",
    "{anonymous}::store_kvcache",
    "paged_attention_ll4mi_QKV_mfma16_kernel",
    "paged_attention_ll4mi_reduce_kernel",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
    "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_dii",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
    "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EELb1EEEvPS3_PS4_i",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT16x32x512_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
)
SAMPLING = "flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024, 1, 4, true, float, int>"
STEP_NAME = "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)"


# ---- the synthetic trace ------------------------------------------------------------------


class _Writer:
    """Events as JSON text straight into the gzip stream (no list of a million dicts)."""

    def __init__(self, out):
        self.out = out
        self.first = True
        self.correlation = 1000

    def event(self, text: str) -> None:
        self.out.write(("" if self.first else ",\n") + text)
        self.first = False

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _x(cat: str, name: str, pid: int, tid: int, start_ns: int, dur_ns: int, args: str) -> str:
    return (f'{{"ph":"X","cat":"{cat}","name":{json.dumps(name)},"pid":{pid},"tid":{tid},'
            f'"ts":{_us(start_ns)},"dur":{_us(dur_ns)},"args":{{{args}}}}}')


def _flow(correlation: int, start_ns: int, gpu_start_ns: int) -> tuple[str, str]:
    return (f'{{"ph":"s","id":{correlation},"pid":251,"tid":251,"ts":{_us(start_ns)},"cat":"ac2g","name":"ac2g"}}',
            f'{{"ph":"f","id":{correlation},"pid":0,"tid":3,"ts":{_us(gpu_start_ns)},"cat":"ac2g","name":"ac2g",'
            f'"bp":"e"}}')


def write_trace(path: Path, steps: int, mode: str) -> int:
    """A decode profile of `steps` steps; returns the number of kernels written."""
    kernels = 0
    host = BASE_US * 1000
    with gzip.open(path, "wt", compresslevel=1, encoding="utf-8") as out:
        out.write('{"schemaVersion":1,"deviceProperties":[{"id":0,"name":"AMD Instinct MI300X",'
                  '"totalGlobalMem":206141652992,"computeMajor":9,"computeMinor":4,"numSms":304}],'
                  '"distributedInfo":{"backend":"nccl","rank":0,"world_size":1},"traceEvents":[\n')
        w = _Writer(out)
        for _ in range(steps):
            step_start = host
            gpu = host + 40_000
            for copy in range(3):  # the step's inputs: H2D from pinned memory
                c = w.next_correlation()
                w.event(_x("cuda_runtime", "cudaMemcpyAsync", 251, 251, host, 5_000, f'"correlation":{c}'))
                w.event(_x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 3, gpu, 1_500,
                           f'"device":0,"stream":3,"correlation":{c},"kind":"HtoD","bytes":{256 << copy}'))
                for flow in _flow(c, host, gpu):
                    w.event(flow)
                host += 7_000
                gpu += 2_000
            if mode == "graph":
                c = w.next_correlation()
                w.event(_x("cuda_runtime", "cudaGraphLaunch", 251, 251, host, 30_000, f'"correlation":{c}'))
                for flow in _flow(c, host, gpu):
                    w.event(flow)
                host += 32_000
                for _layer in range(LAYERS):
                    for name in LAYER_KERNELS * 4 + LAYER_KERNELS[:7]:  # 55 kernels per layer
                        w.event(_x("kernel", name, 0, 3, gpu, 4_500,
                                   f'"device":0,"stream":3,"correlation":{c},"kind":"Dispatch Kernel"'))
                        gpu += 5_000
                        kernels += 1
            else:
                for _layer in range(LAYERS):
                    for name in LAYER_KERNELS * 4 + LAYER_KERNELS[:7]:
                        c = w.next_correlation()
                        w.event(_x("cpu_op", "aten::mm", 251, 251, host, 9_000, f'"External id":{c}'))
                        w.event(_x("cuda_runtime", "cudaLaunchKernel", 251, 251, host + 2_000, 5_000,
                                   f'"correlation":{c},"External id":{c}'))
                        w.event(_x("kernel", name, 0, 3, max(gpu, host + 8_000), 4_500,
                                   f'"device":0,"stream":3,"correlation":{c},"External id":{c}'))
                        for flow in _flow(c, host + 2_000, max(gpu, host + 8_000)):
                            w.event(flow)
                        gpu = max(gpu, host + 8_000) + 5_000
                        host += 10_000
                        kernels += 1
            c = w.next_correlation()
            host = max(host, gpu - 20_000)
            w.event(_x("cuda_runtime", "cudaLaunchKernel", 251, 251, host, 6_000, f'"correlation":{c}'))
            w.event(_x("kernel", SAMPLING, 0, 3, gpu, 12_000, f'"device":0,"stream":3,"correlation":{c}'))
            kernels += 1
            gpu += 14_000
            host = max(host + 8_000, gpu + 1_000)
            w.event(_x("user_annotation", STEP_NAME, 251, 251, step_start, host - step_start, '"External id":1'))
            w.event(_x("cpu_op", "aten::copy_", 251, 251, host - 5_000, 3_000, '"External id":2'))
        out.write("\n]}\n")
    return kernels


def write_stack_trace(path: Path, kernels: int) -> int:
    """An eager profile recorded `with_stack`: per kernel its cpu op, launch, kernel and flow
    pair, and ten python_function frames (which become no frame of the Trace)."""
    host, gpu, c = BASE_US * 1000, BASE_US * 1000 + 40_000, 1000
    with gzip.open(path, "wt", compresslevel=1, encoding="utf-8") as out:
        out.write('{"schemaVersion":1,"traceEvents":[\n')
        w = _Writer(out)
        w.event(_x("user_annotation", STEP_NAME, 251, 251, host, kernels * 10_000, '"External id":1'))
        for k in range(kernels):
            c += 1
            for depth in range(10):
                w.event(_x("python_function", f"sglang/srt/layers/linear.py({100 + depth}): forward", 251, 251,
                           host + depth * 10, 9_000 - depth * 20, f'"Python id":{c * 10 + depth},'
                           f'"Python parent id":{c * 10 + depth - 1},"Python thread":0'))
            w.event(_x("cpu_op", "aten::mm", 251, 251, host, 9_000, f'"External id":{c}'))
            w.event(_x("cuda_runtime", "cudaLaunchKernel", 251, 251, host + 2_000, 5_000,
                       f'"correlation":{c},"External id":{c}'))
            w.event(_x("kernel", LAYER_KERNELS[k % len(LAYER_KERNELS)], 0, 3, gpu, 4_500,
                       f'"device":0,"stream":3,"correlation":{c},"External id":{c}'))
            host += 10_000
            gpu += 10_000
        out.write("\n]}\n")
    return kernels


def synth_trace(path: Path, steps: int) -> None:
    subprocess.run([sys.executable, "-m", "nsys_ledger.cli", "synth", "--format", "kineto", "--steps", str(steps),
                    str(path)], check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


# ---- the cases ----------------------------------------------------------------------------


class _BaselineEvent(msgspec.Struct, gc=False):
    """The issue's floor: only ph/cat/name/ts/dur of each event (any JSON type)."""
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None


class _BaselineDocument(msgspec.Struct, gc=False):
    traceEvents: list[_BaselineEvent]



def _case(name: str, path: str) -> dict:
    """Run one case in this process; returns seconds and peak RSS. The bare parses run with the
    cyclic GC paused, which is their best case (millions of fresh dicts would otherwise trigger
    collections); the reader needs no pause, its structs are not GC-tracked."""
    if name in ("json", "orjson", "msgspec", "baseline"):
        gc.disable()
    if name.startswith("capped"):
        return _capped_case(name, path)
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    if name == "json":
        json.loads(gzip.decompress(Path(path).read_bytes()))
    elif name == "orjson":
        import orjson

        orjson.loads(gzip.decompress(Path(path).read_bytes()))
    elif name == "msgspec":
        msgspec.json.decode(gzip.decompress(Path(path).read_bytes()))
    elif name == "baseline":
        msgspec.json.decode(gzip.decompress(Path(path).read_bytes()), type=_BaselineDocument)
    elif name == "read":
        from nsys_ledger.trace import load_trace

        load_trace(path)
    elif name == "import":
        from nsys_ledger.trace import load_trace  # noqa: F401 - the import is what is measured
    elif name == "check_json":  # the whole CLI process: its own peak RSS is RUSAGE_CHILDREN's
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-m", "nsys_ledger.cli", "check", path, "--json",
                                   str(Path(tmp) / "result.json")], capture_output=True, text=True)
            if proc.returncode not in (0, 1):
                raise RuntimeError(proc.stderr.strip().splitlines()[-1])
        seconds, cpu = time.perf_counter() - start, _children_cpu_seconds()
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {"seconds": seconds, "cpu_seconds": cpu, "peak_mib": peak_mib}
    elif name == "check":
        from nsys_ledger.api import check

        result = check(path)
        assert result.step_table.height > 0
    else:
        raise ValueError(name)
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_mib": peak_mib}


def _capped_case(name: str, path: str) -> dict:
    """`load_trace` (or the whole-document reader) with the data segment capped at what the
    process holds after a warm-up plus 3/4 of the JSON's size (BENCH_CAP_FRACTION: another share).
    RLIMIT_DATA, not RLIMIT_AS: polars' allocator reserves address space it never touches."""
    from nsys_ledger.trace import load_trace

    json_bytes = sum(len(piece) for piece in _gunzip_pieces(path))
    tiny = Path(tempfile.mkdtemp()) / "tiny.json"
    tiny.write_text('{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1}]}')
    if name == "capped_whole":  # the text decoded at once, then its events, then columns
        from unittest import mock

        from nsys_ledger.trace import kineto_reader

        def load(p):
            with mock.patch.object(kineto_reader, "_collect", kineto_reader._collect_whole):
                return load_trace(p)
    else:
        load = load_trace
    load(tiny)  # imports, polars' thread pools
    held = _vm_bytes()
    cap = held + int(json_bytes * float(os.environ.get("BENCH_CAP_FRACTION", "0.75")))
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    start = time.perf_counter()
    try:
        kernels = load(path).kernels.height
        outcome = f"read {kernels:,} kernels"
    except MemoryError:
        outcome = "MemoryError"
    except Exception as exc:  # noqa: BLE001 - a bench row: say what happened
        outcome = f"{type(exc).__name__}: {str(exc)[:80]}"
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu_seconds": _cpu_seconds(), "json_mib": json_bytes / 2**20,
            "cap_above_warm_mib": (cap - held) / 2**20, "outcome": outcome,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _gunzip_pieces(path: str):
    with gzip.open(path, "rb") as fh:
        while piece := fh.read(1 << 24):
            yield piece


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_seconds() -> float:
    """User + system CPU time of this process, all threads: less moved by other load than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


CASES = {
    "json": "bare parse: json.loads (stdlib)",
    "orjson": "bare parse: orjson.loads",
    "msgspec": "bare parse: msgspec.json.decode",
    "baseline": "baseline: gunzip + typed ph/cat/name/ts/dur",
    "read": "read: load_trace (Kineto reader)",
    "import": "import of the package (part of read)",
    "check": "check (no ledger)",
    "check_json": "check + JSON (CLI process)",
}


def _run_case(name: str, path: Path, repeat: int) -> dict | None:
    """The case in `repeat` fresh processes: the median wall and CPU time, the largest peak."""
    env = {**os.environ, "NSYS_LEDGER_PROGRESS": "0"}
    runs = []
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, __file__, "--case", name, "--trace", str(path)],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"  {name}: skipped ({last})")
            return None
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]) | {"load": os.getloadavg()[0]})
    median = dict(runs[0])
    median.update(seconds=statistics.median(r["seconds"] for r in runs),
                  cpu_seconds=statistics.median(r["cpu_seconds"] for r in runs),
                  peak_mib=max(r["peak_mib"] for r in runs), load=statistics.median(r["load"] for r in runs),
                  runs=len(runs))
    return median


def _kernels_count(text: str) -> int:
    return int(float(text[:-1]) * {"k": 1e3, "M": 1e6}[text[-1]]) if text[-1] in "kM" else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="1M", help="kernels per trace (100k, 1M, ...)")
    parser.add_argument("--modes", default="graph", help="graph, eager or both (comma-separated)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the median counts")
    parser.add_argument("--cases", default=",".join(CASES), help="which cases (comma-separated)")
    parser.add_argument("--capped", help="also the capped-memory cases on a with_stack trace of this many kernels")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_case(args.case, args.trace)))
        return

    OUT.mkdir(parents=True, exist_ok=True)
    per_step = LAYERS * (len(LAYER_KERNELS) * 4 + 7) + 1
    steps = max(1, round(_kernels_count(args.kernels) / per_step))
    rows = []
    for mode in args.modes.split(","):
        if mode == "synth":
            synth_steps = max(1, round(_kernels_count(args.kernels) / 2077))
            path = OUT / f"synth-kineto-{synth_steps}steps.trace.json.gz"
            if not path.is_file():
                synth_trace(path, synth_steps)
            kernels = synth_steps * 2077
        else:
            path = OUT / f"kineto-{mode}-{steps}steps.trace.json.gz"
            if not path.is_file():
                started = time.perf_counter()
                written = write_trace(path, steps, mode)
                print(f"wrote {path.name}: {written:,} kernels, {path.stat().st_size / 2**20:.0f} MiB gzip "
                      f"in {time.perf_counter() - started:.0f} s")
            kernels = steps * per_step
        print(f"{path.name} ({kernels:,} kernels, load {os.getloadavg()[0]:.1f})")
        measured = {}
        for case in args.cases.split(","):
            figures = _run_case(case, path, args.repeat)
            if figures:
                measured[case] = figures
                print(f"  {CASES[case]:<36} {figures['seconds']:7.2f} s wall {figures['cpu_seconds']:7.2f} s cpu "
                      f"{figures['peak_mib']:7.0f} MiB  (load {figures['load']:.1f})")
        for case, figures in measured.items():
            rows.append({
                "trace": path.name, "mode": mode, "kernels": kernels, "case": case, **figures,
                "x_json": figures["seconds"] / measured["json"]["seconds"] if "json" in measured else None,
                "x_msgspec": figures["seconds"] / measured["msgspec"]["seconds"] if "msgspec" in measured else None,
                "x_json_cpu": figures["cpu_seconds"] / measured["json"]["cpu_seconds"] if "json" in measured else None,
            })
        if "baseline" in measured:
            base = measured["baseline"]
            json_mib = sum(len(piece) for piece in _gunzip_pieces(str(path))) / 2**20
            for case in ("read", "check", "check_json"):
                if case in measured:
                    print(f"  {case} / baseline: {measured[case]['seconds'] / base['seconds']:.2f}x wall, "
                          f"{measured[case]['cpu_seconds'] / base['cpu_seconds']:.2f}x cpu; peak "
                          f"{measured[case]['peak_mib'] / json_mib:.2f}x the JSON's {json_mib:.0f} MiB")
            if "read" in measured and "import" in measured:
                reading = measured["read"]["seconds"] - measured["import"]["seconds"]
                print(f"  read less the import ({measured['import']['seconds']:.2f} s): {reading:.2f} s, "
                      f"{reading / base['seconds']:.2f}x the baseline")
        if "check" in measured and "json" in measured and "msgspec" in measured:
            check_s = measured["check"]["seconds"]
            check_cpu = measured["check"]["cpu_seconds"]
            print(f"  check / bare parse (wall): {check_s / measured['json']['seconds']:.2f}x json.loads, "
                  f"{check_s / measured['msgspec']['seconds']:.2f}x msgspec"
                  + (f", {check_s / measured['orjson']['seconds']:.2f}x orjson" if "orjson" in measured else ""))
            print(f"  check / bare parse (cpu):  {check_cpu / measured['json']['cpu_seconds']:.2f}x json.loads, "
                  f"{check_cpu / measured['msgspec']['cpu_seconds']:.2f}x msgspec")
    if args.capped:
        path = OUT / f"kineto-stack-{args.capped}.trace.json.gz"
        if not path.is_file():
            write_stack_trace(path, _kernels_count(args.capped))
        for case in ("capped_stream", "capped_whole"):
            figures = _run_case(case, path, 1)
            if figures:
                rows.append({"trace": path.name, "mode": "with_stack", "case": case, **figures})
                print(f"  {case}: {figures['outcome']} from {figures['json_mib']:.0f} MiB of JSON with the data "
                      f"segment capped at +{figures['cap_above_warm_mib']:.0f} MiB, {figures['seconds']:.1f} s, "
                      f"peak {figures['peak_mib']:.0f} MiB")
    (OUT / "kineto_results.json").write_text(json.dumps({
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(), "rows": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
