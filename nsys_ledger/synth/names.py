"""Kernel names as structure, spelled by whichever demangler the output format implies.

The same kernel is spelled differently by the two demanglers our inputs come from
(see shared/reference/real-kernel-names.md, "Two demanglers"):

| | nsys SQLite export (`demangledName`) | PyTorch profiler / Kineto (GNU c++filt) |
|---|---|---|
| unsigned template argument | `(unsigned int)2624` | `2624u` |
| int / unsigned long argument | `(int)8`, `(unsigned long)4096` | `8`, `4096ul` |
| bool argument | `(bool)1`, `(bool)0` | `true`, `false` |
| enum argument | `(deep_gemm::GemmType)2` | `(deep_gemm::GemmType)2` |
| parameter of a template type | `const T1 *` (placeholder, const first) | `__nv_bfloat16 const*` |
| pointer | `float *` | `float*` |
| nested template close | `>>` | `> >` |

So the reference schedule holds a `KernelName` (qualified name, typed template arguments,
parameters written once in nsys's spelling) and a writer asks for the spelling of its format:
`KernelName.render("nsys")` for SQLite, `render("cxxfilt")` for a Kineto trace. The one
function that spells a template argument list is `render_template_args`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NSYS = "nsys"
CXXFILT = "cxxfilt"
STYLES = (NSYS, CXXFILT)

# How each integral kind is written: nsys casts, c++filt uses literal suffixes.
_CAST = {"uint": "unsigned int", "int": "int", "ulong": "unsigned long", "long": "long"}
_SUFFIX = {"uint": "u", "int": "", "ulong": "ul", "long": "l"}


@dataclass(frozen=True)
class TemplateArg:
    """One template argument: an integral value of a kind, a bool, an enum value, or a type.

    kind: "uint", "int", "ulong", "long", "bool", "enum" (value cast to `enum_type`) or "type"
    (`text` is the spelling; `cxxfilt_text` where c++filt spells the type differently)."""

    kind: str
    value: int = 0
    text: str = ""
    cxxfilt_text: str = ""

    def render(self, style: str) -> str:
        if self.kind in _CAST:
            if style == NSYS:
                return f"({_CAST[self.kind]}){self.value}"
            return f"{self.value}{_SUFFIX[self.kind]}"
        if self.kind == "bool":
            if style == NSYS:
                return f"(bool){int(bool(self.value))}"
            return "true" if self.value else "false"
        if self.kind == "enum":  # both demanglers print the cast
            return f"({self.text}){self.value}"
        if style == CXXFILT and self.cxxfilt_text:
            return self.cxxfilt_text
        return self.text


def uint(v: int) -> TemplateArg:
    return TemplateArg("uint", v)


def int_(v: int) -> TemplateArg:
    return TemplateArg("int", v)


def bool_(v: bool | int) -> TemplateArg:
    return TemplateArg("bool", int(bool(v)))


def enum(enum_type: str, v: int) -> TemplateArg:
    return TemplateArg("enum", v, enum_type)


def type_(text: str, cxxfilt_text: str = "") -> TemplateArg:
    return TemplateArg("type", 0, text, cxxfilt_text)


def render_template_args(args: tuple[TemplateArg, ...], style: str = NSYS) -> str:
    """`<a, b, ...>` in the demangler style of `style` ("nsys" or "cxxfilt")."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, not {style!r}")
    inner = ", ".join(a.render(style) for a in args)
    # c++filt separates a nested template's closing bracket from ours; nsys writes `>>`
    close = " >" if style == CXXFILT and inner.endswith(">") else ">"
    return f"<{inner}{close}"


_PLACEHOLDER = re.compile(r"\bT(\d+)\b")
_CONST_PLACEHOLDER = re.compile(r"\bconst (T\d+|[A-Za-z_][\w:]*)( \*+| &)")
_CONST_ARG = re.compile(r"\bconst (T\d+|[A-Za-z_][\w:]*)([,>])")  # `TensorInfo<const T1, T3>`


def _cxxfilt_params(text: str, args: tuple[TemplateArg, ...]) -> str:
    """The c++filt spelling of a parameter list written in nsys's: template placeholders `T<n>`
    become the n-th template argument's type, `const X *` becomes `X const*`, and pointers and
    references lose their space."""
    def const_after(m: re.Match) -> str:
        return f"{m.group(1)} const{m.group(2)}"

    out = _CONST_PLACEHOLDER.sub(const_after, text)
    out = _CONST_ARG.sub(lambda m: f"{m.group(1)} const{m.group(2)}", out)
    out = _PLACEHOLDER.sub(lambda m: args[int(m.group(1)) - 1].render(CXXFILT), out)
    out = out.replace(" *", "*").replace(" &", "&")
    return re.sub(r">>", "> >", out)


@dataclass(frozen=True)
class KernelName:
    """A demangled kernel name as structure.

    qualname: `deep_gemm::sm90_fp8_gemm_1d2d_impl`; args: template arguments (None: not a
    template); params: the parameter list as nsys prints it (`const T1 *, void *, int`), None
    for C-style names that have no parameter list (cuBLAS `nvjet_...`, Triton kernels)."""

    qualname: str
    args: tuple[TemplateArg, ...] | None = None
    params: str | None = None

    def render(self, style: str = NSYS) -> str:
        if self.params is None:
            return self.qualname
        tmpl = render_template_args(self.args, style) if self.args is not None else ""
        params = self.params if style == NSYS else _cxxfilt_params(self.params, self.args or ())
        # both demanglers print the return type of a function template, not of a plain function
        ret = "void " if self.args is not None else ""
        qualname = self.qualname
        if style == CXXFILT:  # nsys shortens the anonymous namespace
            qualname = qualname.replace("<unnamed>", "(anonymous namespace)")
        return f"{ret}{qualname}{tmpl}({params})"


def plain(name: str) -> KernelName:
    """A C-style kernel name (no template, no parameter list): the same in every style."""
    return KernelName(name)
