"""JUnit XML of a check, so that CI systems list every ledger check as a test case.

One test case per check that ran (each anchor, the total, H2D copies, graph launches, gaps,
each layer group when the per-layer ledger ran); a check with several findings (too few in
some steps and too many in others, or an H2D count and a pageable copy) becomes one failing
case per finding, so the failure count equals the number of findings. The failure carries
the finding's message, where it came from, the steps, and the hint.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from nsys_ledger import __version__
from nsys_ledger.api import Result
from nsys_ledger.checks.ledger import Finding

# Characters XML 1.0 cannot hold at all (a kernel name may contain any of them).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: object) -> str:
    """`text` with the characters XML 1.0 forbids written as visible escapes (\\x01)."""
    return _NOT_XML.sub(lambda m: repr(m.group())[1:-1], str(text))


def junit_document(result: Result) -> ET.Element:
    """`<testsuites>` with one `<testsuite>` for the trace."""
    suite = ET.Element("testsuite", name=xml_text(f"nsys-ledger check {Path(result.trace.path).name}"))
    _add_properties(suite, result)
    cases = _test_cases(result)
    for case in cases:
        suite.append(case)
    failures = sum(1 for case in cases if case.find("failure") is not None)
    skipped = sum(1 for case in cases if case.find("skipped") is not None)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    suite.set("time", "0")
    ET.SubElement(suite, "system-out").text = xml_text(_summary_text(result))
    # junit-10.xsd allows `skipped` on <testsuite> only, not on <testsuites>
    root = ET.Element("testsuites", name="nsys-ledger", tests=str(len(cases)), failures=str(failures), errors="0")
    root.append(suite)
    return root


def write_junit(result: Result, path: str | Path) -> None:
    tree = ET.ElementTree(junit_document(result))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def _add_properties(suite: ET.Element, result: Result) -> None:
    properties = ET.SubElement(suite, "properties")
    values = {
        "trace": result.trace.path,
        "nsys_version": result.trace.meta.nsys_version or "unknown",
        "ledger": result.expectations.path if result.expectations else "none",
        "decode_steps": str(result.step_table.height),
        "step_method": result.steps.method,
        "verdict": result.verdict,
        "tool": f"nsys-ledger {__version__}",
    }
    for name, value in values.items():
        ET.SubElement(properties, "property", name=name, value=xml_text(value))


def _test_cases(result: Result) -> list[ET.Element]:
    if result.expectations is None:
        case = _case("nsys-ledger.ledger", "ledger checks")
        ET.SubElement(case, "skipped", message="no ledger checked: --summary-only (--expect FILE gates a ledger)")
        return [case]
    cases: list[ET.Element] = []
    seen: dict[str, int] = {}
    # The trace's name in the class keeps cases of several traces apart in one CI view.
    trace_name = Path(result.trace.path).stem.replace(".", "_")
    for outcome in result.outcomes:
        classname = f"nsys-ledger.{trace_name}.{outcome.source.split('.')[0]}"
        if outcome.passed:
            cases.append(_case(classname, _unique(outcome.name, seen)))
            continue
        for finding in outcome.findings:
            name = outcome.name if len(outcome.findings) == 1 else f"{outcome.name} [{finding.source}]"
            case = _case(classname, _unique(name, seen))
            failure = ET.SubElement(case, "failure", message=xml_text(finding.message), type=finding.check)
            failure.text = xml_text(_failure_text(finding))
            cases.append(case)
    return cases


def _case(classname: str, name: str) -> ET.Element:
    return ET.Element("testcase", classname=xml_text(classname), name=xml_text(name), time="0")


def _unique(name: str, seen: dict[str, int]) -> str:
    """Test case names must differ within a class for CI systems to show them apart."""
    seen[name] = seen.get(name, 0) + 1
    return name if seen[name] == 1 else f"{name} ({seen[name]})"


def _failure_text(finding: Finding) -> str:
    lines = [
        finding.message,
        f"expectation: {finding.source}",
        f"expected {finding.expected}, observed {finding.observed}",
        f"steps: {finding.steps} ({finding.failing_steps} failing)",
    ]
    if finding.hint:
        lines.append(f"hint: {finding.hint}")
    return "\n".join(lines)


def _summary_text(result: Result) -> str:
    checks = ", ".join(o.name for o in result.outcomes) or "none"
    return (
        f"verdict {result.verdict}; {result.step_table.height} decode steps by {result.steps.method}; "
        f"checked: {checks}"
    )
