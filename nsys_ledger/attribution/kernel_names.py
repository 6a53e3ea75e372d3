"""Read the template arguments of a demangled kernel name, whatever the demangler.

Real GEMM kernels carry their shape in template arguments, and both the argument order and
the spelling change: DeepGEMM moved N and K from the first to the second and third place and
then behind a `(cute::UMMA::Major)` argument (shared/reference/real-kernel-names.md), nsys's
demangler writes `(unsigned int)2624` and `(bool)0` where GNU c++filt (the PyTorch profiler)
writes `2624u` and `false`. A regex per layout breaks with every DeepGEMM release, so names are
parsed once into their template arguments and ops match by value (`GemmSignature`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An integral template argument in either demangler's spelling: `(unsigned int)2624`,
# `(int)-2`, `(unsigned long)4096`, `2624u`, `4096ul`, `64`.
_INT_ARG = re.compile(
    r"^(?:\((?:(?:un)?signed )?(?:int|long|long long|short|char|unsigned)\))?(-?\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU])$"
)
_BOOL_ARG = re.compile(r"^(?:\(bool\)([01])|(true|false))$")
# A cast to an enum: `(deep_gemm::GemmType)2`, `(cute::UMMA::Major)0`.
_ENUM_ARG = re.compile(r"^\(([A-Za-z_][\w:]*)\)(-?\d+)$")
_ANONYMOUS = ("(anonymous namespace)", "<unnamed>")
# Kernels whose function name says they multiply matrices: their integer arguments may hold
# the problem shape.
_GEMM_FUNCTION = re.compile(r"(?i)gemm|bmm|matmul")

# DeepGEMM's GemmType enum (deep_gemm/include/deep_gemm/common/types.hpp): the value in the
# cast, and the enumerator names a demangler may print instead.
GEMM_TYPES = {0: "normal", 1: "contiguous", 2: "masked", 3: "k_contiguous", 4: "batched"}
_GEMM_TYPE_NAMES = {
    "Normal": "normal",
    "MGroupedContiguous": "contiguous",
    "MGroupedMasked": "masked",
    "KGroupedContiguous": "k_contiguous",
    "Batched": "batched",
}
_GEMM_TYPE_NAMED = re.compile(r"GemmType::(\w+)")
# How many leading integer arguments may hold the shape: DeepGEMM puts N, K first (2025-02),
# after SHAPE_M (2025-07 and the 2026 layouts), or after two granularity arguments and SHAPE_M
# (sm100: `128u, 128u, 0u, N, K`); a fused GEMM puts M first (`fused_a_gemm_kernel<1, N, K>`),
# a router GEMM its tile sizes (`<..., 128, 8, 16, 256, 7168>`). Past the sixth come block
# sizes and stages, which only look like shapes.
SHAPE_WINDOW = 7


def function_name(name: str) -> str:
    """The kernel's function name without namespaces or arguments (`sm90_fp8_gemm_1d2d_impl`)."""
    head, _ = _split_head(name)
    return head.rsplit("::", 1)[-1]


def template_args(name: str) -> tuple[str, ...]:
    """The top-level template arguments of the kernel function, stripped; () if it has none."""
    _, rest = _split_head(name)
    if not rest.startswith("<"):
        return ()
    args: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in rest:
        if ch in "<(":
            depth += 1
            if depth == 1:
                continue
        elif ch in ">)":
            depth -= 1
            if depth == 0:
                args.append("".join(current).strip())
                return tuple(args)
        elif ch == "," and depth == 1:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    return ()  # unbalanced: a name cut by its source (`[TRUNCATED-IN-SOURCE]` rows)


def _split_head(name: str) -> tuple[str, str]:
    """(qualified function name, the rest from its template list or parameter list on)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    i = 0
    while i < len(text):
        for anonymous in _ANONYMOUS:
            if text.startswith(anonymous, i):
                i += len(anonymous)
                break
        else:
            if text[i] in "<(":
                return text[:i], text[i:]
            i += 1
    return text, ""


_ANONYMOUS_CANONICAL = "(anonymous namespace)"


def canonical_kernel_name(name: str) -> str:
    """One spelling of a kernel whatever demangled it: nsys's `void <unnamed>::k<(int)2048,
    (bool)0>(const float *)` and c++filt's `void (anonymous namespace)::k<2048, false>(float
    const*)` both give `(anonymous namespace)::k<2048, false>`. The qualified function name
    and its template arguments (integers and bools by value), without the parameter list:
    nsys writes its types as T1, T2 where c++filt spells them out, so no spelling of it
    matches across the two."""
    head, _ = _split_head(name)
    for anonymous in _ANONYMOUS:
        head = head.replace(anonymous, _ANONYMOUS_CANONICAL)
    args = [_canonical_arg(arg) for arg in template_args(name)]
    return f"{head.strip()}<{', '.join(args)}>" if args else head.strip()


def _canonical_arg(arg: str) -> str:
    value = int_value(arg)
    if value is not None:
        return str(value)
    flag = bool_value(arg)
    if flag is not None:
        return "true" if flag else "false"
    if arg.startswith("&"):  # a function: nsys `&silu`, c++filt `&(silu(float const&))`
        function = arg[1:].strip()
        if function.startswith("(") and function.endswith(")"):
            function = function[1:-1]
        return "&" + function.split("(", 1)[0].strip()
    if "<" in arg and not arg.startswith("("):  # a template of its own: `OpaqueType<2u>`
        return canonical_kernel_name(arg)
    return " ".join(arg.split()).replace("<unnamed>", _ANONYMOUS_CANONICAL)


def int_value(arg: str) -> int | None:
    """The value of an integral template argument, None for anything else (bools included)."""
    m = _INT_ARG.match(arg)
    return int(m.group(1)) if m else None


def bool_value(arg: str) -> bool | None:
    m = _BOOL_ARG.match(arg)
    if not m:
        return None
    return m.group(1) == "1" if m.group(1) is not None else m.group(2) == "true"


@dataclass(frozen=True)
class GemmSignature:
    """What a templated GEMM kernel's name says about its problem."""

    function: str  # e.g. sm90_fp8_gemm_1d2d_impl
    ints: tuple[int, ...]  # the integral template arguments, in order (bools and enums left out)
    kind: str | None  # GEMM_TYPES value from `(deep_gemm::GemmType)N`; None when the name has none

    def has_shape(self, n: int, k: int) -> bool:
        """N and K appear as neighbours among the leading integer arguments."""
        lead = self.ints[:SHAPE_WINDOW]
        return any(lead[i] == n and lead[i + 1] == k for i in range(len(lead) - 1))

    def probable_shape(self) -> tuple[int, int] | None:
        """The (N, K) the name most likely states: after a runtime SHAPE_M of 0, else the first
        two integers. None when the name holds no shape (a run of zeros, or fewer than two)."""
        lead = self.ints[:SHAPE_WINDOW]
        if _has_zero_run(lead):
            return None
        for i, value in enumerate(lead[:-2]):
            if value == 0 and lead[i + 1] > 0 and lead[i + 2] > 0:
                return lead[i + 1], lead[i + 2]
        if len(lead) >= 2 and lead[0] > 0 and lead[1] > 0:
            return lead[0], lead[1]
        return None


def _has_zero_run(lead: tuple[int, ...]) -> bool:
    """Three zeros in a row: M, N and K all given at run time."""
    return any(lead[i] == lead[i + 1] == lead[i + 2] == 0 for i in range(len(lead) - 2))


def gemm_signature(name: str) -> GemmSignature | None:
    """The signature of a templated GEMM kernel name; None for any other kernel."""
    function = function_name(name)
    if not _GEMM_FUNCTION.search(function):
        return None
    args = template_args(name)
    ints: list[int] = []
    kind: str | None = None
    for arg in args:
        value = int_value(arg)
        if value is not None:
            ints.append(value)
            continue
        enum = _ENUM_ARG.match(arg)
        if enum and enum.group(1).endswith("GemmType"):
            kind = GEMM_TYPES.get(int(enum.group(2)), f"type{enum.group(2)}")
            continue
        named = _GEMM_TYPE_NAMED.search(arg)
        if named and named.group(1) in _GEMM_TYPE_NAMES:
            kind = _GEMM_TYPE_NAMES[named.group(1)]
    if not ints:
        return None
    return GemmSignature(function=function, ints=tuple(ints), kind=kind)


def gemm_shape_text(name: str) -> str | None:
    """What a templated GEMM's name says of its problem (`N=512 K=6144, normal`, or `shape not
    in the name, normal`); None for other kernels."""
    signature = gemm_signature(name)
    if signature is None:
        return None
    shape = signature.probable_shape()
    kind = f", {signature.kind}" if signature.kind else ""
    return f"N={shape[0]} K={shape[1]}{kind}" if shape else f"shape not in the name{kind}"
