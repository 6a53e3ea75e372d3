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
Then, each case in a fresh process (so its peak RSS is its own), it measures:

* bare parse: gunzip + `json.loads` (standard library), `orjson.loads` and `msgspec.json.decode`
  (untyped) of the same file, with the cyclic GC paused: the floor any reader pays;
* read: `load_trace` (the Kineto reader: typed msgspec decoding, columns, no Trace checks);
* check: `nsys_ledger.check` without a ledger (steps from the annotations, ops, layers, gaps,
  H2D, graph replays), as `nsys-ledger check trace.json.gz` runs it.

Prints seconds, peak RSS and the ratio to the standard library's bare parse and to msgspec's,
and writes bench/out/kineto_results.json.

    python bench/bench_kineto.py                       # 1M kernels, graph mode
    python bench/bench_kineto.py --kernels 100k --modes graph,eager
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

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


# ---- the cases ----------------------------------------------------------------------------


def _case(name: str, path: str) -> dict:
    """Run one case in this process; returns seconds and peak RSS. The bare parses run with the
    cyclic GC paused, which is their best case (millions of fresh dicts would otherwise trigger
    collections); the reader needs no pause, its structs are not GC-tracked."""
    if name in ("json", "orjson", "msgspec"):
        gc.disable()
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    if name == "json":
        json.loads(gzip.decompress(Path(path).read_bytes()))
    elif name == "orjson":
        import orjson

        orjson.loads(gzip.decompress(Path(path).read_bytes()))
    elif name == "msgspec":
        import msgspec

        msgspec.json.decode(gzip.decompress(Path(path).read_bytes()))
    elif name == "read":
        from nsys_ledger.trace import load_trace

        load_trace(path)
    elif name == "check":
        from nsys_ledger.api import check

        result = check(path)
        assert result.step_table.height > 0
    else:
        raise ValueError(name)
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_mib": peak_mib}


def _cpu_seconds() -> float:
    """User + system CPU time of this process, all threads: less moved by other load than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


CASES = {
    "json": "bare parse: json.loads (stdlib)",
    "orjson": "bare parse: orjson.loads",
    "msgspec": "bare parse: msgspec.json.decode",
    "read": "read: load_trace (Kineto reader)",
    "check": "check (no ledger)",
}


def _run_case(name: str, path: Path, repeat: int) -> dict | None:
    """The case in `repeat` fresh processes; the run with the least wall time."""
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
    return min(runs, key=lambda run: run["seconds"])


def _kernels_count(text: str) -> int:
    return int(float(text[:-1]) * {"k": 1e3, "M": 1e6}[text[-1]]) if text[-1] in "kM" else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="1M", help="kernels per trace (100k, 1M, ...)")
    parser.add_argument("--modes", default="graph", help="graph, eager or both (comma-separated)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest counts")
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
        path = OUT / f"kineto-{mode}-{steps}steps.trace.json.gz"
        if not path.is_file():
            started = time.perf_counter()
            written = write_trace(path, steps, mode)
            print(f"wrote {path.name}: {written:,} kernels, {path.stat().st_size / 2**20:.0f} MiB gzip "
                  f"in {time.perf_counter() - started:.0f} s")
        kernels = steps * per_step
        print(f"{path.name} ({kernels:,} kernels, load {os.getloadavg()[0]:.1f})")
        measured = {}
        for case in CASES:
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
        if "check" in measured:
            check_s = measured["check"]["seconds"]
            check_cpu = measured["check"]["cpu_seconds"]
            print(f"  check / bare parse (wall): {check_s / measured['json']['seconds']:.2f}x json.loads, "
                  f"{check_s / measured['msgspec']['seconds']:.2f}x msgspec"
                  + (f", {check_s / measured['orjson']['seconds']:.2f}x orjson" if "orjson" in measured else ""))
            print(f"  check / bare parse (cpu):  {check_cpu / measured['json']['cpu_seconds']:.2f}x json.loads, "
                  f"{check_cpu / measured['msgspec']['cpu_seconds']:.2f}x msgspec")
    (OUT / "kineto_results.json").write_text(json.dumps({
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(), "rows": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
