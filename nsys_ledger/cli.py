"""The `nsys-ledger` command: parse arguments, call the library, map outcomes to exit codes.

Exit codes: 0 every check passed (or a summary without expectations), 1 the ledger is
violated, 2 usage or input error (one line on stderr naming the file and the problem).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import click

from nsys_ledger import __version__
from nsys_ledger.errors import InputError
from nsys_ledger.report.text import printable
from nsys_ledger.safety import (MAX_BATCH, finite_number, gap_us_option, guard_outputs, regex_option,
                                write_atomically)

EXIT_INPUT_ERROR = 2
STDOUT = "-"  # `--json -`: the document on stdout, as Unix tools read `-`


def _echo_fitted(text: str) -> None:
    """Text whose every line fits the terminal (report/layout.py)."""
    from nsys_ledger.report.layout import fit_lines, terminal_width

    click.echo("\n".join(fit_lines(text.splitlines(), terminal_width())))


def _fail(message: str) -> None:
    # printable: a file name may hold a newline or an ESC; the error must stay one line
    click.echo(f"nsys-ledger: error: {printable(message)}", err=True)
    sys.exit(EXIT_INPUT_ERROR)


def _empty_directory(path: str) -> Path:
    """Fail early when OUT cannot become a directory of table files (exists and is not empty)."""
    target = Path(path)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise InputError(path, "cannot write output: exists and is not an empty directory")
    if not target.parent.is_dir():
        raise InputError(path, f"cannot write output: directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise InputError(path, "cannot write output: permission denied")
    return target


class _Group(click.Group):
    """Turns input errors (and any unexpected error) into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InputError as error:
            _fail(str(error))
        except click.UsageError as error:  # a bad option value: one line naming the option
            param = getattr(error, "param", None)
            hint = param.opts[0] if param is not None and getattr(param, "opts", None) else None
            _fail(f"{hint}: {error.message}" if hint else error.message)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except Exception as error:  # a bug or an input we did not foresee: still one line
            if os.environ.get("NSYS_LEDGER_DEBUG"):
                raise
            _fail(f"internal error: {type(error).__name__}: {error} (NSYS_LEDGER_DEBUG=1 shows the traceback)")


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="nsys-ledger")
def main() -> None:
    """Check Nsight Systems traces of LLM inference against a declared kernel ledger.

    \b
    Examples:
      nsys-ledger check trace.sqlite
      nsys-ledger check trace.sqlite --expect expectations/glm-5.3-tp8-ep8.toml --json out.json
      nsys-ledger compare sglang.sqlite vllm.sqlite --expect-a sglang.toml --expect-b vllm.toml
      nsys-ledger expectations show expectations/glm-5.3-tp8-ep8.toml
      nsys-ledger synth out.sqlite --mode graph --steps 8 --fault broken_fusion
    """


@main.command()
@click.argument("traces", metavar="TRACE...", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("--expect", "expect", type=click.Path(path_type=str), help="Expectations (ledger) TOML file.")
@click.option("--step-nvtx", callback=regex_option, help="Regex of the NVTX range that marks one decode step.")
@click.option(
    "--step-method",
    type=click.Choice(["auto", "nvtx", "graph", "marker", "capture"]),
    default=None,
    help="Force how steps are found (default: the expectations' [steps] method, else auto).",
)
@click.option("--gap-us", type=float, callback=gap_us_option,
              help="Gap threshold in microseconds (default: expectations, else 2).")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=None,
              help="Requests per decode step, for kernels per output token (default: the expectations' batch).")
@click.option("--per-stream-gaps", is_flag=True, help="Also find the idle gaps of every stream on its own.")
@click.option("--json", "json_path", type=click.Path(path_type=str),
              help="Write the JSON result to this file (`-`: to stdout, the report then goes to stderr).")
@click.option("--html", "html_path", type=click.Path(path_type=str),
              help="Write the triage report (one self-contained HTML file) to this file.")
@click.option("--junit", "junit_path", type=click.Path(path_type=str),
              help="Write JUnit XML (one test case per check) to this file.")
@click.option("--markdown", "markdown_path", type=click.Path(path_type=str),
              help="Write a short Markdown summary (CI step summary, PR comment) to this file.")
@click.option("--summary-only", is_flag=True,
              help="No ledger on purpose: let --junit/--markdown report the trace without gating it "
                   "(without --expect they refuse, so that a CI job cannot pass with no ledger checked).")
@click.option("-j", "--jobs", type=click.IntRange(1), default=None,
              help="Processes for several trace files (default: one per file, at most one per core); "
                   "for one file, processes for its step windows (default 1).")
@click.option("--window-steps", type=click.IntRange(0), default=None, metavar="N",
              help="Decode steps per window of the per-step checks: memory follows the window, not the "
                   "trace (default 256; 64 for an export of over a million kernels, read through a store on "
                   "disk unless --html or --trace-out needs its kernels; 0: the whole trace in one window, "
                   "in memory). The result is the same.")
@click.option("--dask", "dask_address", metavar="ADDRESS",
              help="Check several trace files (or the step windows of one) on a Dask cluster: the "
                   "scheduler's address (tcp://host:8786), or `local` for a LocalCluster on this machine "
                   "(needs `pip install nsys-ledger[dask]`).")
@click.option("--no-cache", is_flag=True,
              help="Export an .nsys-rep afresh instead of reusing the export kept beside it.")
@click.option("--capture", "captures", multiple=True, type=click.Path(path_type=str), metavar="FILE|DIR",
              help="PyTorch profiler capture trace(s) of the CUDA/HIP graphs (SGLang --enable-profile-cuda-graph, "
                   "vLLM): replayed graph kernels get the module and layer they were captured in. Repeatable.")
@click.option("--trace-out", "trace_out", type=click.Path(path_type=str),
              help="Write the worst and a representative decode step as a Chrome trace (Perfetto UI, "
                   "chrome://tracing): kernels per stream, copies, launch calls, gaps, findings.")
def check(traces, captures, trace_out, expect, step_nvtx, step_method, gap_us, batch, per_stream_gaps, json_path,
          html_path, junit_path, markdown_path, summary_only, jobs, window_steps, dask_address, no_cache) -> None:
    """Count the kernels of every decode step in TRACE and compare them with the ledger.

    \b
    TRACE: an SQLite export, an `nsys export --type parquetdir` / `arrowdir` directory, or an
    .nsys-rep report (exported once with nsys, kept beside it; --no-cache to skip).
    Several TRACEs (files, directories, glob patterns) are one export per rank: each is
    checked in its own process (or on a Dask cluster with --dask) and the ranks are stacked
    (rank = file order, then process order in a file), e.g.
    `nsys-ledger check rank*.sqlite --expect ledger.toml`.

    \b
    Exit codes: 0 pass (or summary without --expect), 1 ledger violated, 2 bad input.
    --junit and --markdown without --expect are refused (exit 2) unless --summary-only says
    that no ledger is meant.
    \b
    In CI:
      nsys-ledger check trace.sqlite --expect ledger.toml --html report.html --junit junit.xml \\
          --markdown summary.md
    """
    from nsys_ledger.pipeline.multifile import check_many
    from nsys_ledger.report.chrome_trace import write_chrome_trace
    from nsys_ledger.report.html import write_html
    from nsys_ledger.report.json_report import write_json
    from nsys_ledger.report.junit import write_junit
    from nsys_ledger.report.markdown import write_markdown
    from nsys_ledger.report.terminal import render

    json_to_stdout = json_path == STDOUT
    wanted = [(label, writer, path) for label, writer, path in (
        ("json", write_json, None if json_to_stdout else json_path), ("html", write_html, html_path),
        ("junit", write_junit, junit_path), ("markdown", write_markdown, markdown_path),
        ("trace-out", write_chrome_trace, trace_out)) if path]
    targets = guard_outputs([(f"--{label}", path) for label, _, path in wanted], [*traces, *captures, expect])
    outputs = [(label, writer, target) for (label, writer, _), target in zip(wanted, targets)]
    _reject_ledgers_given_as_traces(traces)
    if (junit_path or markdown_path) and not expect and not summary_only:
        _fail("--junit/--markdown gate a CI job on a ledger and none was given: add --expect FILE "
              "(or --summary-only to write them without checking one)")
    if expect and summary_only:
        raise click.UsageError("--summary-only and --expect exclude each other")
    if captures:
        result = _check_with_captures(traces, captures, expect, step_nvtx=step_nvtx, step_method=step_method,
                                      gap_us=gap_us, batch=batch, per_stream_gaps=per_stream_gaps)
    else:
        result = check_many(traces, expect, workers=jobs, keep_events=bool(html_path or trace_out),
                            dask=dask_address, step_nvtx=step_nvtx, step_method=step_method, gap_us=gap_us,
                            batch=batch, per_stream_gaps=per_stream_gaps, cache=not no_cache,
                            window_steps=window_steps)
    # with --json -, stdout holds the JSON document alone: the report and the file list go to stderr
    click.echo(render(result), err=json_to_stdout)
    if json_to_stdout:
        from nsys_ledger.report.json_report import dumps_indented, result_document

        click.echo(dumps_indented(result_document(result)))
    for label, writer, target in outputs:
        _write_output(writer, result, target, label, err=json_to_stdout)
    sys.exit(result.exit_code)


LEDGER_TABLES = ("model", "params", "steps", "ops", "anchors", "total", "layers")


def _reject_ledgers_given_as_traces(paths, advice: str = "pass it with --expect FILE") -> None:
    """A ledger passed where a trace goes (`check trace.sqlite ledger.toml`): say to use --expect,
    not that the TOML file is no SQLite database."""
    import tomllib

    for path in paths:
        candidate = Path(path)
        if not candidate.is_file() or candidate.stat().st_size > 4 << 20:
            continue
        if candidate.suffix.lower() != ".toml":
            with candidate.open("rb") as fh:
                if b"\0" in fh.read(4096):  # binary: an SQLite file or an archive, not TOML
                    continue
        try:
            document = tomllib.loads(candidate.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, OSError):
            continue
        if any(table in document for table in LEDGER_TABLES):
            raise InputError(path, f"this is a ledger (expectations TOML), not a trace: {advice}")


def _check_with_captures(traces, captures, expect, **options):
    """One replay trace checked with the capture traces of its graphs (`captures.py`)."""
    if len(traces) != 1:
        raise click.UsageError("--capture pairs one replay trace with its capture traces: give one TRACE")
    from nsys_ledger.captures import check_with_captures

    return check_with_captures(traces[0], list(captures), expect, **options)[0]


def _write_output(writer, result, target: Path, label: str, err: bool = False) -> None:
    # checked before the work, but a disk can fill up meanwhile: then the old file stays
    write_atomically(target, lambda path: writer(result, path))
    click.echo(f"{label:<9} {target}", err=err)


@main.command()
@click.argument("before", type=click.Path(dir_okay=True, path_type=str))
@click.argument("after", type=click.Path(dir_okay=True, path_type=str))
@click.option("--expect", "expect", type=click.Path(path_type=str),
              help="Expectations (ledger) TOML file: names the ops and runs the checks on both traces.")
@click.option("--step-nvtx", callback=regex_option, help="Regex of the NVTX range that marks one decode step.")
@click.option("--step-method", type=click.Choice(["auto", "nvtx", "graph", "marker", "capture"]), default=None,
              help="Force how steps are found in both traces.")
@click.option("--gap-us", type=float, callback=gap_us_option,
              help="Gap threshold in microseconds (default: expectations, else 2).")
@click.option("--allow-launches", type=click.FloatRange(0), default=0, show_default=True,
              help="Extra kernel launches per step (median; in all, per op, per layer group) still not worse.")
@click.option("--max-slowdown", type=click.FloatRange(0), default=None,
              help="Also worse when the p90 step time rose by more than this percentage (default: not checked).")
@click.option("--time-tolerance", type=click.FloatRange(0), default=10.0, show_default=True,
              help="List an op's or layer's median GPU time per step when it moved by more than this percentage.")
@click.option("--max-op-slowdown", type=click.FloatRange(0), default=None,
              help="Also worse when an op's or layer's median GPU time rose by more than this percentage "
                   "(default: not checked).")
@click.option("--json", "json_path", type=click.Path(path_type=str),
              help="Write the diff as JSON to this file (`-`: to stdout, the text then goes to stderr).")
@click.option("--html", "html_path", type=click.Path(path_type=str), help="Write the diff as an HTML page.")
def diff(before, after, expect, step_nvtx, step_method, gap_us, allow_launches, max_slowdown, time_tolerance,
         max_op_slowdown, json_path, html_path) -> None:
    """Compare the ledger of AFTER with BEFORE; exit 1 when AFTER is worse.

    \b
    Worse (the default rule): more kernel launches per step (in all, per op, per layer
    group), more CPU submissions, graph launches, H2D or pageable H2D copies per step, an
    idle-gap cause BEFORE did not have, or a ledger check that fails only in AFTER. Per-step
    figures are medians over the decode steps.
    \b
    Exit codes: 0 not worse, 1 worse, 2 bad input.
    \b
    Example:
      nsys-ledger diff main.sqlite pr.sqlite --expect expectations/glm-5.3-tp8-ep8.toml --html diff.html
    """
    from nsys_ledger.api import check as run_check
    from nsys_ledger.diff import WorseningRule, diff_results
    from nsys_ledger.ledger import load_expectations
    from nsys_ledger.report.diff_report import render_diff, write_diff_html, write_diff_json

    json_to_stdout = json_path == STDOUT
    wanted = [(label, writer, path) for label, writer, path in
              (("json", write_diff_json, None if json_to_stdout else json_path), ("html", write_diff_html, html_path))
              if path]
    targets = guard_outputs([(f"--{label}", path) for label, _, path in wanted], [before, after, expect])
    outputs = [(label, writer, target) for (label, writer, _), target in zip(wanted, targets)]
    _reject_ledgers_given_as_traces((before, after))
    expectations_ = load_expectations(expect) if expect else None
    options = dict(step_nvtx=step_nvtx, step_method=step_method, gap_us=gap_us)
    result = diff_results(
        run_check(before, expectations_, **options),
        run_check(after, expectations_, **options),
        WorseningRule(extra_launches_per_step=allow_launches, step_time_slowdown_pct=max_slowdown,
                      time_tolerance_pct=time_tolerance, op_time_slowdown_pct=max_op_slowdown),
    )
    click.echo(render_diff(result), err=json_to_stdout)
    if json_to_stdout:
        import json

        from nsys_ledger.report.diff_report import diff_document

        click.echo(json.dumps(diff_document(result), indent=2, ensure_ascii=False))
    for label, writer, target in outputs:
        _write_output(writer, result, target, label, err=json_to_stdout)
    sys.exit(result.exit_code)


@main.command()
@click.argument("a", type=click.Path(dir_okay=True, path_type=str))
@click.argument("b", type=click.Path(dir_okay=True, path_type=str))
@click.option("--expect", "expect", type=click.Path(path_type=str),
              help="One ledger for both traces (two versions of one framework).")
@click.option("--expect-a", "expect_a", type=click.Path(path_type=str), help="The ledger of A (its framework's).")
@click.option("--expect-b", "expect_b", type=click.Path(path_type=str), help="The ledger of B (its framework's).")
@click.option("--json", "json_path", type=click.Path(path_type=str),
              help="Write the comparison as JSON to this file (`-`: to stdout, the text then goes to stderr).")
@click.option("--markdown", "markdown_path", type=click.Path(path_type=str), help="Write it as Markdown.")
@click.option("--html", "html_path", type=click.Path(path_type=str), help="Write it as an HTML page.")
def compare(a, b, expect, expect_a, expect_b, json_path, markdown_path, html_path) -> None:
    """Compare two traces of one model (two frameworks, or two versions) by op role and layer.

    \b
    Each trace is checked with its own ledger (--expect-a, --expect-b; --expect gives one
    for both); ops line up by their role (the shared vocabulary of ledger/roles.py), never
    by kernel name, and kernels without a role are counted in "(no role)". Per step kind
    and rank: kernels and GPU time per role and per layer, graph replays and nodes per
    graph, launches outside graphs, cudaGraphLaunch host time per graph and per node, and
    GPU span vs busy vs summed kernel time; medians over the steady-state steps (the first
    step of a kind is dropped when a rank has 3 or more). Deltas are B - A.
    \b
    Exit codes: 0 compared, 2 bad input.
    \b
    Example:
      nsys-ledger compare sglang.sqlite vllm.sqlite --expect-a expectations/glm-5.3-tp8-ep8.toml \\
          --expect-b glm-vllm.toml --html compare.html
    """
    from nsys_ledger.api import check as run_check
    from nsys_ledger.compare import compare as compare_results
    from nsys_ledger.ledger import load_expectations
    from nsys_ledger.report.compare_html import write_compare_html
    from nsys_ledger.report.compare_json import dumps_compare, write_compare_json
    from nsys_ledger.report.compare_markdown import write_compare_markdown
    from nsys_ledger.report.compare_text import render_compare

    if expect and (expect_a or expect_b):
        raise click.UsageError("--expect gives one ledger for both traces: use it alone, or --expect-a/--expect-b")
    ledger_a, ledger_b = (expect_a or expect), (expect_b or expect)
    json_to_stdout = json_path == STDOUT
    wanted = [(label, writer, path) for label, writer, path in (
        ("json", write_compare_json, None if json_to_stdout else json_path), ("markdown", write_compare_markdown,
        markdown_path), ("html", write_compare_html, html_path)) if path]
    targets = guard_outputs([(f"--{label}", path) for label, _, path in wanted], [a, b, ledger_a, ledger_b])
    outputs = [(label, writer, target) for (label, writer, _), target in zip(wanted, targets)]
    _reject_ledgers_given_as_traces((a, b), advice="pass it with --expect-a/--expect-b FILE")
    # the small ledgers first: a typo in one is said before a big trace is read
    expectations_a = load_expectations(ledger_a) if ledger_a else None
    expectations_b = load_expectations(ledger_b) if ledger_b else None
    comparison = compare_results(run_check(a, expectations_a), run_check(b, expectations_b))
    click.echo(render_compare(comparison), err=json_to_stdout)
    if json_to_stdout:
        click.echo(dumps_compare(comparison))
    for label, writer, target in outputs:
        _write_output(writer, comparison, target, label, err=json_to_stdout)


@main.group()
def expectations() -> None:
    """Inspect expectations (ledger) files."""


@expectations.command("show")
@click.argument("file", type=click.Path(path_type=str))
def expectations_show(file) -> None:
    """Print the ledger of FILE with every formula evaluated."""
    from nsys_ledger.ledger import load_expectations, render_expectations

    _echo_fitted(render_expectations(load_expectations(file)))


@expectations.command("match")
@click.argument("file", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per name, for scripts.")
def expectations_match(file, as_json) -> None:
    """Classify kernel names read from stdin (one per line) with the ledger of FILE.

    Prints, for each name, the op, its group and what matched (the pattern or the GEMM shape),
    or `no op`. Paste the names of `nsys stats --report cuda_gpu_kern_sum` to see how a
    ledger reads your build:

        nsys-ledger expectations match expectations/glm-5.3-tp8-ep8.toml < names.txt
    """
    import json

    from nsys_ledger.attribution.ops import OpClassifier
    from nsys_ledger.ledger import load_expectations

    classifier = OpClassifier(load_expectations(file))
    names = [name for name in (line.rstrip("\r\n") for line in sys.stdin) if name.strip()]
    for name, match in zip(names, classifier.classify_many(names)):  # each pattern runs once over all
        if as_json:
            click.echo(json.dumps({
                "name": name, "op": match.op if match.matched_by != "none" else None, "group": match.group,
                "matched_by": match.matched_by, "detail": match.detail, "fallback": match.fallback,
            }))
        elif match.matched_by == "none":
            click.echo(f"no op\t-\t-\t{printable(name)}")
        else:
            how = f"{match.matched_by}: {match.detail}" + (" (generic fallback)" if match.fallback else "")
            click.echo(f"{match.op}\t{match.group or '-'}\t{how}\t{printable(name)}")


@expectations.command("diff")
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a, b, equal, changes) instead of text.")
def expectations_diff(a, b, as_json) -> None:
    """What ledgers A and B disagree on, for reviewing a relearned ledger in a pull request.

    Params, ops (added, removed, patterns, GEMM shapes, groups, match priority), anchors,
    total, gaps, H2D, graph launches, ranks, layer classes and their groups, compared on the
    evaluated values the checks use (formulas shown beside them). Exit codes: 0 the same,
    1 they differ, 2 a file cannot be read.

        nsys-ledger expectations diff expectations/glm-5.3-tp8-ep8.toml learned.toml
    """
    import json

    from nsys_ledger.ledger import load_expectations
    from nsys_ledger.ledger.diff import diff_expectations, ledger_diff_json, render_ledger_diff

    changes = diff_expectations(load_expectations(a), load_expectations(b))
    if as_json:
        click.echo(json.dumps(ledger_diff_json(changes, a, b), indent=2, ensure_ascii=False))
    else:
        # regexes and descriptions come from the files: escaped
        _echo_fitted("\n".join(printable(line) for line in render_ledger_diff(changes, a, b).splitlines()))
    sys.exit(1 if changes else 0)


def _param_pair(ctx, param, values) -> dict[str, float]:
    pairs = {}
    for item in values:
        name, sep, value = item.partition("=")
        try:
            pairs[name.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected NAME=NUMBER, e.g. layers=78") from None
        if not sep or not name.strip().isidentifier():
            raise click.BadParameter(f"{item!r}: expected NAME=NUMBER, e.g. layers=78")
        problem = finite_number(pairs[name.strip()], f"parameter {name.strip()!r}", low=0, high=2.0 ** 53)
        if problem:
            raise click.BadParameter(f"{item!r}: {problem}")
    return pairs


def _step_span(ctx, param, value) -> tuple[int, int] | None:
    if value is None:
        return None
    low, sep, high = value.partition("-")
    if not (low.strip().isdigit() and (not sep or high.strip().isdigit())):
        raise click.BadParameter(f"{value!r}: expected A-B or A (decode step indexes)")
    first, last = int(low), int(high if sep else low)
    if first > last:
        raise click.BadParameter(f"{value!r}: the first step {first} is after the last {last}")
    return first, last


@main.command()
@click.argument("traces", metavar="TRACE...", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("--out", "out", required=True, type=click.Path(path_type=str), help="Write the learned ledger here.")
@click.option("--base", type=click.Path(path_type=str),
              help="A ledger to start from: its ops, step and layer rules, parameters and hints.")
@click.option("--tolerance", type=click.IntRange(0), default=0, show_default=True,
              help="Kernels of slack on every learned count (anchors, total, layer groups).")
@click.option("--params", "named_params", multiple=True, callback=_param_pair, metavar="NAME=N",
              help="Name a count for formulas (repeatable): --params moe_layers=75 writes 'moe_layers' for 75.")
@click.option("--from-steps", callback=_step_span, metavar="A-B", help="Learn only from these decode steps (per rank).")
@click.option("--step-nvtx", callback=regex_option, help="Regex of the NVTX range that marks one step.")
@click.option("--step-method", type=click.Choice(["auto", "nvtx", "graph", "marker", "capture"]), default=None,
              help="How to find steps (capture: each process's whole capture is one step).")
@click.option("--name", help="The ledger's [model] name.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Check the traces against the learned ledger and say whether they pass.")
def learn(traces, out, base, tolerance, named_params, from_steps, step_nvtx, step_method, name, verify) -> None:
    """Write the ledger that the decode steps of known-good TRACE(s) obey (several files: ranks).

    \b
        nsys-ledger learn healthy.sqlite --base expectations/glm-5.3-tp8-ep8.toml --out my-build.toml
        nsys-ledger check candidate.sqlite --expect my-build.toml
    """
    from nsys_ledger.ledger import load_expectations
    from nsys_ledger.learn import LearnError, LearnOptions, learn as learn_ledger, write_learned_ledger
    from nsys_ledger.pipeline.multifile import check_many

    target, = guard_outputs([("--out", out)], [*traces, base])
    options = LearnOptions(
        base=load_expectations(base) if base else None, tolerance=tolerance, named_params=named_params,
        from_steps=from_steps, step_nvtx=step_nvtx, step_method=step_method, name=name,
    )
    try:
        ledger = learn_ledger(list(traces), options)
        write_learned_ledger(ledger, target)
    except LearnError as error:
        _fail(str(error))
    classes = len(ledger.layer_classes)
    click.echo(f"learned {len(ledger.ops)} ops, {len(ledger.anchors)} anchors, {classes} layer classes, "
               f"total {ledger.total.describe()} kernels per step -> {printable(out)}")
    if verify:
        result = check_many(list(traces), load_expectations(out), step_nvtx=step_nvtx, step_method=step_method)
        click.echo(f"check of the same traces with it: {result.verdict.upper()} ({result.verdict_sentence})")
        sys.exit(result.exit_code)


@main.command()
@click.argument("files", metavar="FILE...", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "json_path", type=click.Path(path_type=str),
              help="Also write the inventory as JSON to this file ('-': the JSON alone on stdout, the text on stderr).")
def inspect(files, json_path) -> None:
    """What nsys SQLite exports hold: nsys and schema versions, the CUDA graph trace mode, each
    table's rows and columns, and which tables nsys-ledger reads. Read-only: nothing is written
    beside the files. Exit 0, or 2 on a file that is not an SQLite export."""
    from nsys_ledger.report.inspect_text import render_inventory
    from nsys_ledger.report.json_report import dumps_indented
    from nsys_ledger.report.layout import terminal_width
    from nsys_ledger.trace.inspect_export import inspect_document, inspect_export

    json_to_stdout = json_path == STDOUT
    target = None
    if json_path and not json_to_stdout:
        target, = guard_outputs([("--json", json_path)], files)
    _reject_ledgers_given_as_traces(files, advice="`nsys-ledger expectations show FILE` prints it")
    inventories = [inspect_export(path) for path in files]  # every file read before anything is printed
    width = terminal_width()
    click.echo("\n\n".join(render_inventory(inventory, width) for inventory in inventories), err=json_to_stdout)
    document = inspect_document(inventories)
    if json_to_stdout:
        click.echo(dumps_indented(document))
    elif target is not None:
        _write_output(lambda doc, path: Path(path).write_text(dumps_indented(doc) + "\n", encoding="utf-8"),
                      document, target, "json")


# What each `synth --fault` does to the decode steps (synth/generate.py and synth/schedule.py).
FAULT_HELP = {
    "broken_fusion": "norm+quant fusion broken: per_token_group_quant alone (231 per step, not 75)",
    "chunked_indexer": "the indexer's paged_mqa_logits runs in 3 chunks (63 per step, not 21)",
    "extra_gaps": "device idle gaps of unknown cause before o_proj in layers 12, 40 and 68",
    "extra_h2d": "a fourth host-to-device copy per step (positions)",
    "split_graph": "the decode graph captured as two: 2 replays per step with an H2D copy between",
    "layer_fault": "layer 41 launches one kernel more than its peers",
    "pageable_h2d": "the sampling parameters copied from pageable host memory",
    "extra_gaps_host": "the host prepares sampling only after the replay: a host-bound gap",
    "extra_gaps_sync": "a cudaStreamSynchronize between the H2D copies and the graph launch",
    "extra_gaps_collective": "two collectives start late on the device, waiting for their peers",
    "extra_gaps_graph": "the decode graph split in two, the second replay starting late on the device",
    "missing_kernel": "layer 7 launches no kv_a_layernorm: one kernel fewer than its peers",
    "missing_draft_replay": "MTP topology only: the draft graph is not replayed",
}


def _list_faults(ctx, param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    from nsys_ledger.synth import FAULTS
    from nsys_ledger.synth.generate import TOPOLOGY_FAULTS

    for fault in FAULTS + TOPOLOGY_FAULTS:
        click.echo(f"{fault:<22} {FAULT_HELP.get(fault, '')}".rstrip())
    ctx.exit(0)


KINETO_SUFFIX = ".trace.json.gz"  # what the PyTorch profiler names its files, and what `check` recognises


def _kineto_path(out: str) -> str:
    """OUT with the profiler's suffix, unless it already names a (gzip) JSON file."""
    return out if out.endswith((".json.gz", ".json")) else out + KINETO_SUFFIX


@main.command()
@click.argument("out", type=click.Path(path_type=str))
@click.option("--mode", type=click.Choice(["graph", "eager"]), default="graph", show_default=True)
@click.option("--steps", type=click.IntRange(1), default=8, show_default=True, help="Decode steps per rank.")
@click.option("--ranks", type=click.IntRange(1), default=1, show_default=True, help="Processes, one GPU each.")
@click.option("--batch", type=click.IntRange(1), default=32, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fault", "faults", multiple=True, help="Inject a fault (repeatable); see --list-faults.")
@click.option("--list-faults", is_flag=True, expose_value=False, is_eager=True, callback=_list_faults,
              help="List the faults --fault injects, and exit.")
@click.option("--step-nvtx/--no-step-nvtx", default=False, help="Wrap each forward pass in an NVTX range.")
@click.option("--nsys-version", default="2026.2", show_default=True,
              help="Write the export layout of this nsys release: 2021, 2022, 2023.1, 2023.2, 2023.3, 2024, "
                   "2025, 2026 (or a full version such as 2024.6.2).")
@click.option("--layerwise-nvtx/--no-layerwise-nvtx", default=True, show_default=True,
              help="SGLang's per-module NVTX ranges (without them layers can only be inferred).")
@click.option("--capture-batch", "capture_batches", type=click.IntRange(1), multiple=True,
              help="Graph mode: also capture a decode graph for this batch size (repeatable; decode "
                   "replays the --batch one).")
@click.option("--clone-links", type=click.IntRange(1), default=1, show_default=True,
              help="Graph mode: clone links from each exec graph node back to its capture node.")
@click.option("--format", "out_format", type=click.Choice(["sqlite", "parquetdir", "arrowdir", "kineto"]),
              default="sqlite", show_default=True,
              help="sqlite: one file; parquetdir / arrowdir: a directory with one file per table, as `nsys "
                   "export --type parquetdir` / `arrowdir` writes; kineto: the PyTorch profiler's gzip JSON "
                   "(OUT.trace.json.gz unless OUT ends in .json.gz or .json) of the same run, as SGLang's torch "
                   "profile writes it (one rank).")
@click.option("--deepgemm-layout", type=click.Choice(["2025-02", "2025-07", "sglang-2026", "b200"]),
              default=None,
              help="Name the DeepGEMM kernels as this build did: 2025-02 fp8_gemm_kernel<N, K, ...>, 2025-07 "
                   "sm90_fp8_gemm_1d2d_impl<0, N, K, ...>, sglang-2026 the SGLang fork's <(cute::UMMA::Major)0, "
                   "0, N, K, ...>, b200 sm100_fp8_fp4_gemm_1d1d_impl (dense GEMMs without their shape). "
                   "Default: the engine's, sglang-2026 for SGLang, 2025-07 for vLLM.")
@click.option("--topology", type=click.Choice(["glm-5.3-tp8-ep8", "glm-5.3-dp8-ep8", "glm-5.3-tp8-ep8-mtp",
                                               "deepseek-v3.2-tp8-ep8", "glm-5.3-vllm-tp8-ep8",
                                               "glm-5.3-vllm-tp8-ep8-piecewise", "deepseek-v3.2-vllm-tp8-ep8"]),
              default="glm-5.3-tp8-ep8", show_default=True,
              help="The deployment: GLM-5.3 TP8, GLM-5.3 with DP attention (--attn-dp-size 8), GLM-5.3 with "
                   "MTP (draft, verify, draft_extend graphs; graph mode; fault missing_draft_replay), "
                   "DeepSeek-V3.2 TP8; or vLLM V1 serving GLM-5.3 (FULL or PIECEWISE CUDA graphs) or "
                   "DeepSeek-V3.2 (graph mode, SQLite, fault broken_fusion only). Each has its ledger in "
                   "expectations/.")
def synth(out, mode, steps, ranks, batch, seed, faults, step_nvtx, nsys_version, layerwise_nvtx, capture_batches,
          clone_links, out_format, deepgemm_layout, topology) -> None:
    """Write a synthetic nsys export of GLM-5.3 decode to OUT (SQLite, or a Parquet/Arrow directory),
    or its PyTorch profiler (Kineto) trace."""
    from nsys_ledger.synth import FAULTS, generate
    from nsys_ledger.synth.generate import TOPOLOGY_FAULTS
    from nsys_ledger.synth.schema_eras import era_for_version

    known = FAULTS + TOPOLOGY_FAULTS
    unknown = [f for f in faults if f not in known]
    if unknown:
        raise click.BadParameter(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        era_for_version(nsys_version)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--nsys-version") from None
    if out_format == "kineto":
        out = _kineto_path(out)
    columnar = out_format in ("parquetdir", "arrowdir")
    if columnar:
        _empty_directory(out)
    else:
        guard_outputs([("OUT", out)], [])
    # A columnar export is the SQLite export converted, table by table (synth/parquet_writer.py).
    scratch = tempfile.TemporaryDirectory(prefix="nsys-ledger-synth-") if columnar else contextlib.nullcontext()
    with scratch as tmp:
        target = os.path.join(tmp, "export.sqlite") if columnar else out
        try:
            summary = generate(target, mode=mode, steps=steps, ranks=ranks, batch=batch, seed=seed,
                               faults=tuple(faults), step_nvtx=step_nvtx,
                               # a Kineto trace has no nsys export layout
                               nsys_version=None if out_format == "kineto" else nsys_version,
                               layerwise_nvtx=layerwise_nvtx, capture_batch_sizes=(batch, *capture_batches),
                               clone_links=clone_links, deepgemm_layout=deepgemm_layout, topology=topology,
                               format="kineto" if out_format == "kineto" else "sqlite")
        except ValueError as error:  # a combination the generator does not simulate
            raise click.UsageError(str(error)) from None
        if columnar:
            from nsys_ledger.synth.parquet_writer import write_columnar

            write_columnar(target, out, out_format)
    # describe(), not the record: the record lists every kernel name of the step
    click.echo(f"wrote {out}: {summary.describe()}")


if __name__ == "__main__":
    main()
