"""CI outputs of `check`: JUnit XML, the Markdown summary, and the options that write them."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.report.junit import write_junit, xml_text
from nsys_ledger.report.markdown import md, md_code, render_markdown

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

# Failing JUnit cases of each faulted sample: (failure type, start of the message), one per finding.
FAULTED = {
    "glm5-graph-broken-fusion.sqlite": [
        ("anchor", "per_token_group_quant kernels: 231 per step, expected 75"),
        ("total", "kernels: 2233 per step, expected 1800-2200"),
        ("layer_sequence", "layers 0-2: + `per_token_group_quant` after `fused_add_rmsnorm` (after dense sequence entry 15"),
        ("layer_sequence", "layers 1-2: + `per_token_group_quant` after `fused_add_rmsnorm` (after dense sequence entry 1 "),
        ("layer_sequence", "layers 3-77: + `per_token_group_quant` after `fused_add_rmsnorm` (after moe sequence entry 1 "),
        ("layer_sequence", "layers 3-77: + `per_token_group_quant` after `fused_add_rmsnorm` (after moe sequence entry 15"),
    ],
    "glm5-graph-chunked-indexer.sqlite": [
        ("anchor", "paged_mqa_logits kernels: 63 per step, expected 21"),
        ("layer", "layers 0-2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, 70, 74: indexer 9 "
                  "launches per layer, expected 6-7"),
    ],
    "glm5-graph-extra-h2d.sqlite": [("h2d", "host-to-device copies: 4 per step, expected 3")],
    "glm5-graph-split-graph.sqlite": [
        ("h2d", "host-to-device copies: 4 per step, expected 3"),
        ("graph_break", "graph break: the decode graph ran as 2 replays per step, expected 1"),
    ],
    "glm5-graph-pageable-h2d.sqlite": [
        ("h2d_pageable", "pageable host-to-device copies: 1 per step, expected 0"),
        ("gaps", "idle gaps above 2 us: 1 per step"),
    ],
    "glm5-graph-layer41.sqlite": [("layer_sequence", "layer 41: + `elementwise_kernel` after `bmm` (after moe sequence entry 12")],
    "glm5-graph-extra-gaps.sqlite": [("gaps", "idle gaps above 2 us: 3 per step")],
    "glm5-graph-boundary-gap.sqlite": [
        ("graph_break", "graph break: the decode graph ran as 2 replays per step, expected 1"),
        ("gaps", "idle gaps above 2 us: 1 per step"),
    ],
}


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


def junit_of(result, tmp_path: Path) -> ET.Element:
    path = tmp_path / "junit.xml"
    write_junit(result, path)
    return ET.parse(path).getroot()  # the standard library's parser: any CI system can read it


@pytest.mark.parametrize("sample", sorted(FAULTED))
def test_junit_has_one_failing_case_per_finding(sample, expectations, tmp_path):
    result = nsys_ledger.check(SAMPLES / sample, expectations)
    root = junit_of(result, tmp_path)
    suite = root.find("testsuite")
    failures = [(case, case.find("failure")) for case in suite.iter("testcase") if case.find("failure") is not None]
    expected = FAULTED[sample]
    assert [f.get("type") for _, f in failures] == [kind for kind, _ in expected]
    assert [f.get("message")[: len(start)] for (_, f), (_, start) in zip(failures, expected)] == [
        start for _, start in expected
    ]
    assert suite.get("failures") == root.get("failures") == str(len(FAULTED[sample]))
    assert suite.get("tests") == str(len(list(suite.iter("testcase"))))
    for case, failure in failures:
        assert "expectation: " in failure.text and "steps: " in failure.text
        assert case.get("classname").startswith(f"nsys-ledger.{Path(sample).stem}.")
    names = [(c.get("classname"), c.get("name")) for c in suite.iter("testcase")]
    assert len(names) == len(set(names))  # CI systems tell cases apart by class and name


def test_junit_of_the_healthy_sample_lists_every_check_as_passing(expectations, tmp_path):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", expectations)
    suite = junit_of(result, tmp_path).find("testsuite")
    cases = list(suite.iter("testcase"))
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("20", "0", "0")
    assert [c.get("name") for c in cases][:7] == [
        "anchor fused_add_rmsnorm", "anchor sparse_mla", "anchor paged_mqa_logits", "anchor per_token_group_quant",
        "anchor deepep_dispatch", "anchor sampling", "total kernels per step",
    ]
    assert {c.get("classname") for c in cases} == {
        "nsys-ledger.glm5-graph-healthy.anchors", "nsys-ledger.glm5-graph-healthy.total",
        "nsys-ledger.glm5-graph-healthy.h2d", "nsys-ledger.glm5-graph-healthy.graphs",
        "nsys-ledger.glm5-graph-healthy.gaps", "nsys-ledger.glm5-graph-healthy.layers",
    }
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["decode_steps"] == "4" and properties["verdict"] == "pass"


def test_junit_without_a_ledger_is_one_skipped_case(tmp_path):
    root = junit_of(nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite"), tmp_path)
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("skipped"), suite.get("failures")) == ("1", "1", "0")
    assert root.get("skipped") is None  # junit-10.xsd: not an attribute of <testsuites>


# ---- JUnit against the common schema (junit-10.xsd, its facts in tests/fixtures) ----------------

JUNIT_FACTS = json.loads((Path(__file__).parent / "fixtures" / "junit-10.facts.json").read_text(encoding="utf-8"))


def junit_schema_errors(root: ET.Element) -> list[str]:
    """Where `root` breaks junit-10.xsd: unknown or missing attributes, children an element may
    not hold, text where the schema allows none, a time that is not SUREFIRE_TIME."""
    elements, time_pattern = JUNIT_FACTS["elements"], re.compile(JUNIT_FACTS["time_pattern"])
    errors = [] if root.tag == JUNIT_FACTS["root"] else [f"root is <{root.tag}>"]
    for element in root.iter():
        facts = elements.get(element.tag)
        if facts is None:
            errors.append(f"<{element.tag}> is not in the schema")
            continue
        allowed = set(facts["required"]) | set(facts["optional"])
        errors += [f"<{element.tag}> has attribute {name}" for name in element.attrib if name not in allowed]
        errors += [f"<{element.tag}> lacks attribute {name}" for name in facts["required"] if name not in element.attrib]
        errors += [f"<{element.tag}> holds <{child.tag}>" for child in element if child.tag not in facts["children"]]
        if not facts["text"] and (element.text or "").strip():
            errors.append(f"<{element.tag}> holds text")
        for name in JUNIT_FACTS["time_attributes"].get(element.tag, []):
            if name in element.attrib and not time_pattern.fullmatch(element.get(name)):
                errors.append(f"<{element.tag}> time {element.get(name)!r}")
    return errors


def test_the_schema_facts_reject_what_junit_10_forbids():
    bad = ET.fromstring('<testsuites skipped="1"><testsuite name="x" tests="1" failures="0" time="1.5s">'
                        '<testcase><failure/></testcase></testsuite></testsuites>')
    assert junit_schema_errors(bad) == [
        "<testsuites> has attribute skipped",
        "<testsuite> lacks attribute errors",
        "<testsuite> time '1.5s'",
        "<testcase> lacks attribute name",
    ]


@pytest.mark.parametrize("sample, ledger", [
    ("glm5-graph-healthy.sqlite", True), ("glm5-graph-healthy.sqlite", False),
    *((name, True) for name in FAULTED),
])
def test_junit_validates_against_junit_10(sample, ledger, expectations, tmp_path):
    root = junit_of(nsys_ledger.check(SAMPLES / sample, expectations if ledger else None), tmp_path)
    assert junit_schema_errors(root) == []
    failures = len(FAULTED.get(sample, [])) if ledger else 0
    assert (root.get("failures"), root.find("testsuite").get("failures")) == (str(failures), str(failures))


# ---- a CI gate cannot pass without a ledger -------------------------------------------------------

@pytest.mark.parametrize("option", ["--junit", "--markdown"])
def test_a_ci_output_without_expect_is_refused(option, tmp_path):
    target = tmp_path / "out"
    result = CliRunner().invoke(main, ["check", str(SAMPLES / "glm5-graph-healthy.sqlite"), option, str(target)])
    assert result.exit_code == 2 and not target.exists()
    assert result.output.strip() == (
        "nsys-ledger: error: --junit/--markdown gate a CI job on a ledger and none was given: add --expect FILE "
        "(or --summary-only to write them without checking one)")


def test_summary_only_writes_them_and_says_nothing_was_gated(tmp_path):
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    result = CliRunner().invoke(main, ["check", str(SAMPLES / "glm5-graph-healthy.sqlite"), "--summary-only",
                                       "--junit", str(junit), "--markdown", str(summary)])
    assert result.exit_code == 0, result.output
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case.find("skipped").get("message") == "no ledger checked: --summary-only (--expect FILE gates a ledger)"
    assert summary.read_text().startswith(
        "### ℹ️ nsys-ledger SUMMARY ONLY: no ledger checked, this job gates nothing (--expect FILE checks one)\n")


@pytest.mark.parametrize("order", ["ledger first", "ledger second"])
def test_a_ledger_given_as_a_trace_says_use_expect(order, tmp_path):
    trace = str(SAMPLES / "glm5-graph-healthy.sqlite")
    copy = tmp_path / "my-ledger"  # no .toml suffix: recognised by its tables
    copy.write_bytes(GLM.read_bytes())
    for ledger in (str(GLM), str(copy)):
        args = ["check", ledger, trace] if order == "ledger first" else ["check", trace, ledger]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.output.strip() == (f"nsys-ledger: error: {ledger}: this is a ledger (expectations TOML), "
                                         "not a trace: pass it with --expect FILE")


def test_xml_text_keeps_what_xml_cannot_hold_visible():
    assert xml_text("a\x01b\x1fc\nd") == "a\\x01b\\x1fc\nd"


def test_markdown_summary_of_a_faulted_sample(expectations):
    text = render_markdown(nsys_ledger.check(SAMPLES / "glm5-graph-chunked-indexer.sqlite", expectations))
    lines = text.splitlines()
    assert lines[0] == "### ❌ nsys-ledger FAIL: 2 finding(s) in 20 checks on 4 decode steps"
    assert "| ❌ | anchor paged\\_mqa\\_logits | 21 | 63 | 4/4 (0-3) |" in lines
    assert "| ✅ | anchor fused\\_add\\_rmsnorm | 156 | 156 |  |" in lines
    assert any(line.startswith("- **anchors.paged\\_mqa\\_logits**: paged\\_mqa\\_logits kernels: 63 per step")
               for line in lines)
    assert "  - hint: indexer logits were chunked (long context or large batch): paged\\_mqa\\_logits split " \
           "into several launches" in lines
    assert lines[-1].startswith("Step time: median ") and "kernels per step: median 2119" in lines[-1]
    assert len(lines) < 50


def test_markdown_summary_of_the_healthy_sample(expectations):
    text = render_markdown(nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", expectations))
    assert text.startswith("### ✅ nsys-ledger PASS: all 20 checks passed on 4 decode steps\n")
    assert "**Findings**" not in text


def test_markdown_shows_the_names_a_finding_quotes_as_code(expectations):
    text = render_markdown(nsys_ledger.check(SAMPLES / "glm5-graph-broken-fusion.sqlite", expectations))
    assert ("- **layers.classes.moe.sequence**: layers 3-77: + `per_token_group_quant` after `fused_add_rmsnorm` "
            "(after moe sequence entry 1 of 27), in 4 of 4 steps (steps 0-3)") in text.splitlines()
    assert "\\`" not in text  # no literal backtick anywhere
    assert md_code("`a|b` and *c*") == "`a\\|b` and \\*c\\*"


def test_markdown_escapes_table_and_markup_characters():
    assert md("a|b *c* <script>x</script>\nnext") == "a\\|b \\*c\\* &lt;script&gt;x&lt;/script&gt; next"


def test_check_writes_every_output_and_says_where(tmp_path):
    paths = {kind: tmp_path / f"out.{kind}" for kind in ("json", "html", "junit", "markdown")}
    args = ["check", str(SAMPLES / "glm5-graph-extra-h2d.sqlite"), "--expect", str(GLM)]
    for kind, path in paths.items():
        args += [f"--{kind}", str(path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    for kind, path in paths.items():
        assert path.stat().st_size > 0
        assert f"{kind:<9} {path}" in result.output
    assert ET.parse(paths["junit"]).getroot().get("failures") == "1"
    assert paths["markdown"].read_text().startswith("### ❌ nsys-ledger FAIL: 1 finding(s)")
    assert "FAIL: 1 finding(s) in 20 checks on 4 decode steps" in paths["html"].read_text()


@pytest.mark.parametrize("option", ["--html", "--junit", "--markdown"])
def test_unwritable_output_fails_before_the_work(option, tmp_path):
    target = tmp_path / "missing" / "out"
    result = CliRunner().invoke(main, ["check", str(SAMPLES / "glm5-graph-healthy.sqlite"), option, str(target)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"nsys-ledger: error: {target}: cannot write output: directory {target.parent} does not exist"
    )
