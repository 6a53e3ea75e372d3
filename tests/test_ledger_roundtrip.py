"""The ledger writer: load -> write -> load gives back an equal ledger, in the forms a person writes."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsys_ledger.ledger import (
    Anchor,
    Expectations,
    GemmShape,
    H2DRule,
    LayerClass,
    LayerRule,
    OpDef,
    Range,
    StepEntryGaps,
    StepRule,
    diff_expectations,
    load_expectations,
    write_expectations,
)
from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger.writing import key_text, regex_string, value_text

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
SHIPPED = sorted((ROOT / "expectations").glob("*.toml"))


def reload(tmp_path: Path, text: str, name: str = "written.toml") -> Expectations:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_expectations(path)


def assert_round_trip(tmp_path: Path, exp: Expectations) -> str:
    """write(exp) reads back equal to exp (all but the path), and writing that again gives the
    same text."""
    text = write_expectations(exp)
    again = reload(tmp_path, text)
    assert dataclasses.replace(exp, path=again.path) == again
    assert write_expectations(again) == text
    return text


# ---- the shipped ledgers --------------------------------------------------------------------


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_ledger_round_trips(tmp_path, path):
    assert_round_trip(tmp_path, load_expectations(path))


def test_glm_round_trip(tmp_path):
    glm = load_expectations(GLM)
    text = assert_round_trip(tmp_path, glm)
    # the file's formulas and forms survive, not just their values
    for line in (
        'moe_layers = "layers - dense_layers"',
        'marker_op = "sampling"',
        "exclude_nvtx = '(?i)prefill|extend|warm.?up|capture'",
        'gemm = { n = 2624, k = "hidden" }',
        'gemm = [{ n = 512, k = 192, kind = "grouped" }, { n = 256, k = 512, kind = "grouped" }]',
        'gemm = { kind = "grouped" }',
        "fallback = true",
        "patterns = ['deep_ep::']",
        "patterns = ['fused_rope(?:_store)?_kernel', 'ApplyRotary', 'rotary_embedding', 'apply_rope']",
        "  'all_reduce_(?:one|two)_shot\\w*_kernel',",
        'expected = "2 * layers"',
        'max_bytes = "1024 * 1024"',
        "regex = '''(?:'Module': 'model\\.model\\.layers\\.|\\blayers[._]|\\blayer_|nn\\.Module: \\w*DecoderLayer_)(\\d+)'''",
        'layers = { first = "dense_layers", last = "layers - 1" }',
        'layers = "0-2, 6-74/4"',
        'count = "full_indexer_layers"',
        'groups = { attention = "12-16", ffn = "8-10", deepep = 2 }',
            'insert_before = "q_b_proj"',
        'mlp = ["ffn", "deepep"]',
        "step_entry_max_us = 10",
    ):
        assert line in text.splitlines(), line
    # op declaration order is match priority: kept
    assert list(reload(tmp_path, text).ops) == list(glm.ops)
    assert text.index("[ops.deepgemm_dense]") < text.index("[ops.cublas_gemm]")


def test_glm_written_sections_in_file_order():
    glm = load_expectations(GLM)
    text = write_expectations(glm)
    headers = [line for line in text.splitlines() if line.startswith("[") and "." not in line]
    assert headers == ["[model]", "[params]", "[steps]", "[total]", "[gaps]", "[h2d]", "[graphs]", "[ranks]",
                       "[layers]"]
    assert text.count("\n[ops.") == len(glm.ops)
    assert text.count("\n[anchors.") == len(glm.anchors) == 6


# ---- every section and value form, hand-written ----------------------------------------------

EVERY_FORM = r"""
[model]
name = "every form"
description = "two lines, a \"quote\", a \\ backslash\nand a tab\there.\n"

[params]
layers = 8
dense = "min(2, layers)"
moe = "layers - dense"
half = "layers / 2"
ratio = 0.75
batch = 4

[steps]
method = "marker"
marker = 'SamplingFrom(?:Prob|Logits)Kernel'
exclude_nvtx = '(?i:prefill|warm.?up)'
exclude_ops = ["prefill"]

[ops.sampling]
patterns = 'SamplingFromProbKernel'
group = "step"

[ops.norm]
patterns = ["FusedAddRMSNormKernel", "fused_add_rms_?norm"]
group = "attention"
description = "it's the norm: 'quoted' and \"double\""

[ops.proj]
gemm = { n = "1024 * 2", k = 1024 }
group = "attention"

[ops.bmm]
gemm = [{ n = 512, k = 192, kind = "grouped" }, { n = "half * 64", k = 512, kind = "batched" }]
patterns = ["bmm_fp8"]
group = "attention"

[ops.moe_gemm]
gemm = { kind = "masked" }
group = "ffn"

[ops.any_gemm]
gemm = { n = 7, k = 9, kind = "any" }
fallback = true
patterns = ['gemm\w*', "it's"]
group = "ffn"

[ops.prefill]
patterns = ["sparse_attn_fwd_kernel$"]
group = "prefill"

[anchors.sampling]
expected = 1

[anchors.norm]
expected = "2 * layers"
tolerance_pct = 10
hint_low = "too few"
hint_high = "too many"

[anchors.proj]
expected = "7-9"
tolerance = "dense"

[anchors.bmm]
expected = [1, "moe * 2"]

[anchors.moe_gemm]
expected = { min = "moe" }

[anchors.any_gemm]
min = "dense"
max = 40.5

[anchors.prefill]
max = 0

[total]
expected = "10 * layers"
tolerance = 5
hint_high = "more"

[gaps]
threshold_us = 1.5
step_entry_per_launch = 2

[h2d]
per_step = { min = 1 }
max_bytes = "64 * 1024"

[graphs]
launches_per_step = [1, "dense"]

[ranks]
max_imbalance_pct = 12.5

[layers]
regex = '''layers\.(\d+)'s'''
opening_op = "norm"
first_opening_op = "norm"
opening_followed_by = "proj"
closing_op = "norm"
uniform = true

[layers.modules]
self_attn = "attention"
"mlp.experts" = ["ffn", "attention"]

[layers.classes.dense]
layers = [0, "1-1", { first = 0, last = "dense - 1" }]
count = "dense"
groups = { attention = "3-5", ffn = 2 }

[layers.classes.moe]
layers = { first = "dense", last = "layers - 1", step = 1 }
groups = { attention = { min = 3, max = "dense + 3" }, ffn = [2, 3] }

[layers.classes.even]
layers = "FSFS FSFS"

[layers.classes.odd]
layers = "1-7/2"
"""

MINIMAL = """
[model]
name = "minimal"

[ops.x]
patterns = ["x_kernel"]
"""

EAGER = """
[model]
name = "eager, NVTX steps, no graphs"

[params]
layers = 4

[steps]
method = "nvtx"
nvtx = '^decode_step \\d+$'

[ops.attention]
patterns = ["flash_fwd"]
group = "attention"

[gaps]
threshold_us = "5 * 100"

[h2d]
pageable_allowed = false

[layers.classes.all]
layers = "XXXX"
groups = { attention = 1 }
"""


ONE_ITERATION = """
[model]
name = "one iteration captured: the whole capture is the step"

[steps]
method = "capture"

[ops.gemm]
patterns = ["sgemm"]

[total]
expected = 1721
"""


STEP_KINDS = """
[model]
name = "decode, prefill and mixed steps"

[params]
layers = 4

[ops.norm]
patterns = ["RMSNorm"]

[ops.context_attention]
patterns = ["Context$"]

[total]
expected = 80

[kinds.prefill.total]
expected = "20 * layers"
tolerance_pct = 5
hint_low = "a layer's prefill attention is missing"

[kinds.prefill.anchors.context_attention]
expected = "layers"

[kinds.mixed.anchors.norm]
min = "2 * layers"
max = 9
"""


@pytest.mark.parametrize("text", [EVERY_FORM, MINIMAL, EAGER, ONE_ITERATION, STEP_KINDS],
                         ids=["every-form", "minimal", "eager", "one-iteration", "step-kinds"])
def test_hand_written_round_trip(tmp_path, text):
    exp = reload(tmp_path, text, "hand.toml")
    assert_round_trip(tmp_path, exp)


def test_every_form_values_and_written_forms(tmp_path):
    exp = reload(tmp_path, EVERY_FORM, "hand.toml")
    text = write_expectations(exp)
    assert exp.description == 'two lines, a "quote", a \\ backslash\nand a tab\there.\n'
    assert exp.ops["norm"].description == "it's the norm: 'quoted' and \"double\""
    assert exp.ops["bmm"].gemm == (GemmShape(512, 192, "grouped"), GemmShape(256, 512, "batched"))
    assert exp.ops["any_gemm"].fallback is True
    anchors = {a.op: a for a in exp.anchors}
    assert anchors["norm"].expected == Range(pytest.approx(14.4), pytest.approx(17.6))
    assert anchors["proj"].expected == Range(5, 11)
    assert anchors["bmm"].expected == Range(1, 12)
    assert anchors["any_gemm"].expected == Range(2, 40.5)
    assert exp.total == Range(75, 85)
    assert exp.gap_threshold_ns == 1500
    assert exp.step_entry_gaps == StepEntryGaps(per_launch=2, max_ns=None)
    assert exp.h2d == H2DRule(Range(1, None), 65536, True)
    assert exp.graph_launches_per_step == Range(1, 2)
    assert exp.rank_imbalance_pct == 12.5
    classes = {c.name: c.layers for c in exp.layer_classes}
    assert classes == {"dense": (0, 1), "moe": (2, 3, 4, 5, 6, 7), "even": (0, 2, 4, 6), "odd": (1, 3, 5, 7)}
    for line in (
        'dense = "min(2, layers)"',
        "ratio = 0.75",
        "patterns = ['SamplingFromProbKernel']",
        """patterns = ['gemm\\w*', '''it's''']""",
        'gemm = { n = 7, k = 9, kind = "any" }',
        'expected = "7-9"',
        'tolerance = "dense"',
        'expected = [1, "moe * 2"]',
        'expected = { min = "moe" }',
        "max = 40.5",
        "tolerance_pct = 10",
        "threshold_us = 1.5",
        "per_step = { min = 1 }",
        "max_imbalance_pct = 12.5",
        "regex = '''layers\\.(\\d+)'s'''",
        '"mlp.experts" = ["ffn", "attention"]',
        'layers = [0, "1-1", { first = 0, last = "dense - 1" }]',
        'layers = "FSFS FSFS"',
    ):
        assert line in text.splitlines(), line


# ---- a ledger built in code (what `learn` will hand the writer) --------------------------------


def built_in_code() -> Expectations:
    ops = {
        "norm": OpDef("norm", ("FusedAddRMSNormKernel",), "attention", "ops.norm",
                      description="residual add + RMSNorm"),
        "qkv": OpDef("qkv", (), "attention", "ops.qkv", gemm=(GemmShape(2624, 6144, "normal"),)),
        "moe": OpDef("moe", ("fused_moe_kernel",), "ffn", "ops.moe", gemm=(GemmShape(None, None, "masked"),)),
        "gemm": OpDef("gemm", ("nvjet_", "cutlass_\\d+_\\w*gemm"), "ffn", "ops.gemm", fallback=True),
    }
    return Expectations(
        path="<learned>",
        name="learned from 2 captures",
        description="",
        params={"layers": 61, "dense_layers": 3, "moe_layers": 58},
        ops=ops,
        anchors=(
            Anchor("norm", "2 * layers", Range(122, 122), None, None, "anchors.norm"),
            Anchor("moe", "moe_layers ± 2", Range(56, 60), None, None, "anchors.moe"),
            Anchor("qkv", "9-12", Range(9, 12), None, None, "anchors.qkv"),
            # the formula does not give the range (a stale formula): the numbers are written
            Anchor("gemm", "layers", Range(3, 3), None, None, "anchors.gemm"),
        ),
        total=Range(900, 1300),
        total_hint_low=None,
        total_hint_high="an extra pass",
        steps=StepRule("auto", None, "SamplingFromProbKernel", None, ()),
        gap_threshold_ns=2500,
        h2d=H2DRule(Range(2, 4), 4096, False),
        graph_launches_per_step=Range(1, 1),
        batch=None,
        layer_regex=None,
        layer_classes=(
            LayerClass("dense", (0, 1, 2), {"attention": Range(12, 14)}, "layers.classes.dense"),
            LayerClass("moe", tuple(range(3, 61)), {"attention": Range(12, 14), "ffn": Range(7, 9)},
                       "layers.classes.moe"),
        ),
        layer_opening_op="norm",
        layer_rule=LayerRule(uniform=True),
        written={
            "params.moe_layers": "layers - dense_layers",
            "layers.classes.moe.count": "moe_layers",
            "layers.classes.dense.count": "dense_layers + 1",  # wrong: 4 layers, not 3; not written
        },
        comments={
            "params.layers": "61 layers seen in every step",
            "anchors.norm.expected": "122 in 12 of 12 steps (stable)",
            "anchors.moe": "varied 56-60 across steps:\nwritten as a range",
            "total.min": "912-1093 over 12 steps",
        },
    )


def test_built_in_code_writes_formulas_ranges_and_comments(tmp_path):
    exp = built_in_code()
    text = write_expectations(exp)
    lines = text.splitlines()
    for line in (
        "layers = 61  # 61 layers seen in every step",
        'expected = "2 * layers"  # 122 in 12 of 12 steps (stable)',
        'expected = "moe_layers"',
        "tolerance = 2",
        'expected = "9-12"',
        'gemm = { n = 2624, k = 6144 }',
        'gemm = { kind = "masked" }',
        "patterns = ['nvjet_', 'cutlass_\\d+_\\w*gemm']",
        "marker = 'SamplingFromProbKernel'",
        "threshold_us = 2.5",
        'per_step = "2-4"',
        'layers = "0-2"',
        'layers = "3-60"',
        'groups = { attention = "12-14", ffn = "7-9" }',
        'moe_layers = "layers - dense_layers"',
        'count = "moe_layers"',
        "min = 900  # 912-1093 over 12 steps",
        "max = 1300",
    ):
        assert line in lines, line
    # a comment with a line break goes above its table, line by line
    moe = lines.index("[anchors.moe]")
    assert lines[moe - 2:moe] == ["# varied 56-60 across steps:", "# written as a range"]
    assert 'count = "dense_layers + 1"' not in lines
    # the stale formula is not written: the number is
    gemm = lines.index("[anchors.gemm]")
    assert lines[gemm + 1] == "expected = 3"

    loaded = reload(tmp_path, text)
    # the only difference: the stale formula gave way to the number the model holds
    changes = [(c.key, c.change, c.before, c.after) for c in diff_expectations(exp, loaded)]
    assert changes == [("anchors.gemm", "changed", "3 (= layers)", "3")]
    anchors = {a.op: a for a in loaded.anchors}
    assert anchors["norm"].formula == "2 * layers"
    assert anchors["moe"].formula == "moe_layers ± 2"
    assert anchors["moe"].expected == Range(56, 60)
    assert loaded.steps.marker_regex == "SamplingFromProbKernel"
    assert loaded.ops["moe"].gemm == (GemmShape(None, None, "masked"),)
    assert loaded.layer_rule == LayerRule(uniform=True)
    # the writer's text is plain TOML a person can edit
    assert tomllib.loads(text)["anchors"]["norm"] == {"expected": "2 * layers"}


def test_comments_on_defaults_and_on_group_ranges_have_a_place(tmp_path):
    exp = reload(tmp_path, EAGER, "hand.toml")
    commented = dataclasses.replace(exp, comments={
        "graphs": "eager: no graph launches to count",  # a table the ledger leaves out: no place
        "h2d.pageable_allowed": "no pageable copy in 12 steps",
        "steps.method": "one NVTX range per step",
        "layers.classes.all.groups.attention": "1 in 4 of 4 layers",
    })
    text = write_expectations(commented)
    lines = text.splitlines()
    assert "pageable_allowed = false  # no pageable copy in 12 steps" in lines
    assert 'method = "nvtx"  # one NVTX range per step' in lines
    # an inline table cannot hold a comment: the groups get a table of their own
    groups = lines.index("[layers.classes.all.groups]")
    assert lines[groups + 1] == "attention = 1  # 1 in 4 of 4 layers"
    assert "[graphs]" not in text and "no graph launches to count" not in text
    again = reload(tmp_path, text)
    assert dataclasses.replace(exp, path=again.path) == again


def test_a_changed_model_writes_its_new_numbers_not_the_files_formulas(tmp_path):
    glm = load_expectations(GLM)
    anchors = tuple(
        dataclasses.replace(a, expected=Range(160, 160)) if a.op == "fused_add_rmsnorm" else a for a in glm.anchors
    )
    changed = dataclasses.replace(glm, anchors=anchors, params={**glm.params, "hidden": 7168})
    text = write_expectations(changed)
    assert "hidden = 7168" in text.splitlines()
    section = text[text.index("[anchors.fused_add_rmsnorm]"):].splitlines()
    assert section[1] == "expected = 160"
    loaded = reload(tmp_path, text)
    assert {a.op: a.expected for a in loaded.anchors}["fused_add_rmsnorm"] == Range(160, 160)
    # o_proj's `n = "hidden"` now reads 7168, not the model's 6144: its numbers are written
    assert loaded.ops["o_proj"].gemm == (GemmShape(6144, 2048, "normal"),)
    assert "gemm = { n = 6144, k = 2048 }" in text.splitlines()


def test_hostile_strings_round_trip(tmp_path):
    exp = reload(tmp_path, MINIMAL, "hand.toml")
    patterns = ("a'''b", "ends with '", "tab\there", 'quote " and \\ back', "ünïcode")
    ops = {"x": dataclasses.replace(exp.ops["x"], patterns=patterns,
                                    description='three """ quotes\nand \x1b escape')}
    hostile = dataclasses.replace(exp, ops=ops, name="name with \u202e bidi and \x7f")
    text = write_expectations(hostile)
    assert "\x1b" not in text and "\x7f" not in text
    loaded = reload(tmp_path, text)
    assert loaded.ops["x"].patterns == patterns
    assert loaded.ops["x"].description == 'three """ quotes\nand \x1b escape'
    assert loaded.name == hostile.name


# ---- one source of truth for the format ----------------------------------------------------


def test_the_format_reference_names_every_key_the_readers_accept():
    """The package docstring is the format's reference (README points to it): every table and
    key a section reader accepts is named there."""
    import nsys_ledger.ledger as ledger
    from nsys_ledger.ledger.document import TOP_LEVEL
    from nsys_ledger.ledger.sections import counts, kinds, layers, model, ops, steps, timeline

    reference = ledger.__doc__
    for table in TOP_LEVEL:
        assert f"[{table}" in reference, table
    keys = (*model.MODEL_KEYS, *steps.STEP_KEYS, *ops.OP_KEYS, *counts.COUNT_KEYS, *timeline.GAPS_KEYS,
            *timeline.H2D_KEYS, *timeline.GRAPHS_KEYS, *timeline.RANKS_KEYS, *layers.LAYERS_KEYS,
            *layers.CLASS_KEYS)
    for kind_key in kinds.KIND_KEYS:
        assert f"[kinds.KIND.{kind_key}" in reference, kind_key
    for kind in kinds.SECTION_KINDS:
        assert kind in reference, kind
    for key in keys:
        assert f"{key} =" in reference or f"[layers.{key}" in reference, key
    for method in steps.STEP_METHODS:
        assert f'"{method}"' in reference, method
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## The ledger format" in readme
    assert "nsys_ledger/ledger/__init__.py" in readme


# ---- any text survives the writer's strings ------------------------------------------------

# any Unicode text but surrogates, which UTF-8 (and so TOML) cannot hold
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_any_text_reads_back_as_a_value_a_regex_and_a_key(text):
    assert tomllib.loads(f"v = {value_text(text)}\n")["v"] == text
    assert tomllib.loads(f"v = {regex_string(text)}\n")["v"] == text
    if text:
        assert tomllib.loads(f"{key_text(text)} = 1\n") == {text: 1}


def test_step_kind_sections_values_and_written_forms(tmp_path):
    exp = reload(tmp_path, STEP_KINDS, "kinds.toml")
    assert sorted(exp.kinds) == ["mixed", "prefill"]
    prefill = exp.kinds["prefill"]
    assert prefill.total == Range(76, 84)
    assert prefill.total_hint_low == "a layer's prefill attention is missing"
    assert [(a.op, a.expected, a.source) for a in prefill.anchors] == [
        ("context_attention", Range(4, 4), "kinds.prefill.anchors.context_attention")]
    assert exp.kinds["mixed"].total == Range(None, None)
    assert exp.kinds["mixed"].anchors[0].expected == Range(8, 9)
    text = write_expectations(exp)
    assert '[kinds.prefill.total]\nexpected = "20 * layers"\ntolerance_pct = 5\n' in text
    assert '[kinds.mixed.anchors.norm]\nmin = "2 * layers"\nmax = 9\n' in text


@pytest.mark.parametrize(("section", "problem"), [
    ("[kinds.decode.total]\nexpected = 3", "no [kinds.decode]"),
    ("[kinds.verify.total]\nexpected = 3", "unknown step kind 'verify' (one of prefill, mixed)"),
    ("[kinds.mixed.anchors.nope]\nexpected = 3", "unknown op 'nope'"),
    ("[kinds.mixed]\n", "declares nothing"),
])
def test_step_kind_sections_refuse_what_they_cannot_check(tmp_path, section, problem):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nname = "x"\n[ops.norm]\npatterns = ["RMSNorm"]\n' + section + "\n")
    with pytest.raises(ExpectationsError, match=re.escape(problem)):
        load_expectations(path)
