"""`check` of a replay trace together with the capture traces of its CUDA/HIP graphs.

`nsys-ledger check decode.json.gz --capture capture_traces/` reads the capture profiles that
SGLang (`--enable-profile-cuda-graph`) and vLLM write, pairs every replayed graph kernel with
its capture-time launch (`attribution.capture_traces`), and checks the replay trace with those
origins in it: the layer attribution then finds layers through the capture-time ranges, and
the result carries one notice with the share of replayed kernels that got a module or layer.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from nsys_ledger.api import Result, check
from nsys_ledger.attribution.capture_traces import CaptureAttribution, attach_captures
from nsys_ledger.ledger import Expectations
from nsys_ledger.progress import stage
from nsys_ledger.trace import load_trace


def check_with_captures(
    trace_path: str | os.PathLike[str],
    captures: list[str | os.PathLike[str]],
    expectations: str | Path | Expectations | None = None,
    **options: Any,
) -> tuple[Result, CaptureAttribution]:
    """`api.check` of `trace_path` with the capture-time origin of its graph kernels."""
    options.pop("cache", None)  # capture pairing reads the trace itself: no report cache applies
    with stage(f"reading {Path(trace_path).name}"):
        trace = load_trace(trace_path)
    with stage("pairing replayed graph kernels with their capture"):
        attribution = attach_captures(trace, list(captures))
    result = check(attribution.trace, expectations, **options)
    return dataclasses.replace(result, notices=(*result.notices, attribution.notice())), attribution
