"""The ledger: expectations files, their model, a reader and a writer, and the safe formula evaluator.

This docstring is the reference of the expectations TOML format (README's "The ledger format"
points here). `load_expectations(path)` reads a file into a validated, evaluated
`Expectations`; `write_expectations(exp)` writes one back as TOML text; `diff_expectations`
lists what two ledgers disagree on.

Where things are: `model` (the dataclasses the checks read), `load` (file -> `Expectations`),
`document` (the sections in file order, read and written), `sections/` (one reader and one
writer per table, side by side), `reading` and `writing` (typed access with key-and-line
errors; TOML text with comments), `formula` (the safe evaluator), `render`
(``expectations show``), `diff` (``expectations diff``).

The layout (every table but ``[model]`` and ``[ops]`` may be left out):

```toml
[model]    name = "...", description = "..."
[params]   layers = 78, moe_layers = "layers - dense_layers"   # numbers or formulas
[steps]    method = "auto" | "nvtx" | "graph" | "marker" | "capture"
           nvtx = REGEX, marker = REGEX (or marker_op = OP), exclude_nvtx = REGEX,
           exclude_ops = [OP, ...]
           (capture: each process's whole capture is one step, for a one-iteration capture)
[ops.NAME] patterns = [REGEX, ...], group = "attention", role = ROLE, description = "...",
           gemm = { n = F, k = F, kind = KIND } or [ {...}, ... ], fallback = BOOL
           (declaration order is match priority: the first op whose pattern or GEMM shape
           matches wins; `gemm` matches a templated GEMM by N and K among its leading integer
           arguments and by DeepGEMM's GemmType, in any layout and demangler style; KIND is
           normal (the default with a shape), masked, contiguous, batched, grouped or any;
           `fallback = true` marks a generic catch-all, reported apart in the op coverage;
           ROLE is one of the shared vocabulary in nsys_ledger/ledger/roles.py, so that
           `compare` lines up the ops of two ledgers of different frameworks)
[anchors.OP]  expected = RANGE, tolerance = N | tolerance_pct = P   (or min = F, max = F)
              hint_low = "...", hint_high = "..."
[total]    same keys as an anchor: kernels per step
[gaps]     threshold_us = 2, step_entry_per_launch = N, step_entry_max_us = F, allowed_per_step = N
           (a graph-mode step may start with N idle gaps per graph launch, each at most F µs:
           the GPU waits for the host's cudaGraphLaunch; gaps inside the replay stay findings;
           allowed_per_step: a step fails only with more gaps above the threshold than this,
           default 0; `learn` writes it when a known-good capture shows gaps beyond its
           healthy distribution)
[h2d]      per_step = RANGE, max_bytes = N, pageable_allowed = false
[graphs]   launches_per_step = RANGE
[ranks]    max_imbalance_pct = P   (busy time of the slowest rank over the least busy one)
[layers]   regex = REGEX (one capturing group: the layer index), opening_op = OP,
           first_opening_op = OP, opening_followed_by = OP, closing_op = OP, uniform = BOOL
[layers.modules]       SUBMODULE = GROUP or [GROUP, ...]   (NVTX sub-module -> ledger groups)
[layers.classes.NAME]  layers = LAYERS, groups = { GROUP = RANGE, ... }, count = F,
                       sequence = [ENTRY, ...], insert_before = OP
[kinds.KIND.total]       same keys as [total]: kernels per step of that kind
[kinds.KIND.anchors.OP]  same keys as an anchor
           (KIND is prefill or mixed; the rest of the ledger is the decode step. Steps of a
           kind the ledger declares are checked against it; steps of another kind are counted
           and listed, not checked)
```

A class's `sequence` lists the kernels of one of its layers in issue order; an ENTRY is
``"op"``, ``"op n"`` or ``"op a-b"`` (``0-1``: optional; ``1-8``: a chunked launch), and ops
joined by ``|`` name the ops whose kernels may fill the place, the first being the op the place
counts as (``"router_gemm|cublas_gemm"``: a tile-named cuBLAS GEMM in the router's place is the
router). A class with `insert_before = OP` puts its sequence into the sequence of the layer's
other class, before that class's entry of OP (the indexer inside the attention); each layer
has at most one class with a sequence of its own.

A RANGE is a number, a formula (``"2 * layers"``), two plain numbers joined by a dash
(``"7-9"``; write ``"(a - b)"`` for a subtraction of two literals), a two-item array
``[low, high]`` of numbers or formulas, or a table ``{ min = F, max = F }`` (either may be
left out). LAYERS is an array of indexes and ``"a-b"`` strings, a string of comma separated
items ``"0-2, 6-74/4"`` (``/4``: every 4th), a pattern string with one character per layer
(``F`` or ``X``: member, ``S`` or ``.``: not; spaces and ``_`` ignored), or a table
``{ first = F, last = F, step = F }`` (inclusive). A layer may belong to several classes (a
full-indexer class on top of dense/MoE), but each (layer, group) is declared by one class only.

Regexes must work both in Python's `re` and in polars (Rust regex): no look-around, no
back-references; flags only at the start of a standalone regex or scoped, as ``(?i:...)``.
Every error is an `ExpectationsError(path, problem)`; the problem starts with the key at
fault and, where the key can be found in the text, its line.

Written back (`write_expectations`), regexes become TOML literal strings (``'...'``), ranges
compact forms (``3``, ``"7-9"``), layer lists ``"0-2, 6-74/4"``; a value the file wrote as a
formula (or in any other form) keeps that form (`Expectations.written`), and
`Expectations.comments` adds a ``# comment`` after a value or above a table.
"""

from nsys_ledger.ledger.diff import LedgerChange, diff_expectations
from nsys_ledger.ledger.document import read_expectations, write_expectations
from nsys_ledger.ledger.formula import FormulaError, evaluate, evaluate_params
from nsys_ledger.ledger.load import load_expectations
from nsys_ledger.ledger.model import (
    Anchor,
    Expectations,
    GemmShape,
    H2DRule,
    KindSection,
    LayerClass,
    LayerRule,
    OpDef,
    Range,
    StepEntryGaps,
    StepRule,
)
from nsys_ledger.ledger.render import render_expectations
from nsys_ledger.ledger.sections.layers import compact_layers

__all__ = [
    "Anchor",
    "Expectations",
    "FormulaError",
    "GemmShape",
    "H2DRule",
    "KindSection",
    "LayerClass",
    "LayerRule",
    "LedgerChange",
    "OpDef",
    "Range",
    "StepEntryGaps",
    "StepRule",
    "compact_layers",
    "diff_expectations",
    "evaluate",
    "evaluate_params",
    "load_expectations",
    "read_expectations",
    "render_expectations",
    "write_expectations",
]
