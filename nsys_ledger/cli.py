"""The `nsys-ledger` command: parse arguments, call the library, map outcomes to exit codes.

Exit codes: 0 every check passed (or a summary without expectations), 1 the ledger is
violated, 2 usage or input error (one line on stderr naming the file and the problem).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from nsys_ledger import __version__
from nsys_ledger.errors import InputError

EXIT_INPUT_ERROR = 2


def _fail(message: str) -> None:
    click.echo(f"nsys-ledger: error: {message}", err=True)
    sys.exit(EXIT_INPUT_ERROR)


def _writable(path: str) -> Path:
    """Fail early (before the work) when an output file cannot be written."""
    target = Path(path)
    if target.is_dir():
        raise InputError(path, "cannot write output: is a directory")
    if not target.parent.exists():
        raise InputError(path, f"cannot write output: directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(path, "cannot write output: permission denied")
    return target


class _Group(click.Group):
    """Turns input errors (and any unexpected error) into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InputError as error:
            _fail(str(error))
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
      nsys-ledger expectations show expectations/glm-5.3-tp8-ep8.toml
      nsys-ledger synth out.sqlite --mode graph --steps 8 --fault broken_fusion
    """


@main.command()
@click.argument("trace", type=click.Path(dir_okay=True, path_type=str))
@click.option("--expect", "expect", type=click.Path(path_type=str), help="Expectations (ledger) TOML file.")
@click.option("--step-nvtx", help="Regex of the NVTX range that marks one decode step.")
@click.option(
    "--step-method",
    type=click.Choice(["auto", "nvtx", "graph", "marker"]),
    default=None,
    help="Force how steps are found (default: the expectations' [steps] method, else auto).",
)
@click.option("--gap-us", type=float, help="Gap threshold in microseconds (default: expectations, else 2).")
@click.option("--json", "json_path", type=click.Path(path_type=str), help="Write the JSON result to this file.")
def check(trace, expect, step_nvtx, step_method, gap_us, json_path) -> None:
    """Count the kernels of every decode step in TRACE and compare them with the ledger.

    \b
    Exit codes: 0 pass (or summary without --expect), 1 ledger violated, 2 bad input.
    """
    from nsys_ledger.api import check as run_check
    from nsys_ledger.report.json_report import write_json
    from nsys_ledger.report.terminal import render

    json_target = _writable(json_path) if json_path else None
    result = run_check(trace, expect, step_nvtx=step_nvtx, step_method=step_method, gap_us=gap_us)
    click.echo(render(result))
    if json_target:
        write_json(result, json_target)
        click.echo(f"json      {json_target}")
    sys.exit(result.exit_code)


@main.group()
def expectations() -> None:
    """Inspect expectations (ledger) files."""


@expectations.command("show")
@click.argument("file", type=click.Path(path_type=str))
def expectations_show(file) -> None:
    """Print the ledger of FILE with every formula evaluated."""
    from nsys_ledger.ledger import load_expectations, render_expectations

    click.echo(render_expectations(load_expectations(file)))


@main.command()
@click.argument("out", type=click.Path(path_type=str))
@click.option("--mode", type=click.Choice(["graph", "eager"]), default="graph", show_default=True)
@click.option("--steps", type=click.IntRange(1), default=8, show_default=True, help="Decode steps per rank.")
@click.option("--ranks", type=click.IntRange(1), default=1, show_default=True, help="Processes, one GPU each.")
@click.option("--batch", type=click.IntRange(1), default=32, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fault", "faults", multiple=True, help="Inject a fault (repeatable); see --list-faults.")
@click.option("--step-nvtx/--no-step-nvtx", default=False, help="Wrap each forward pass in an NVTX range.")
def synth(out, mode, steps, ranks, batch, seed, faults, step_nvtx) -> None:
    """Write a synthetic nsys SQLite export of GLM-5.3 decode to OUT."""
    from nsys_ledger.synth import FAULTS, generate

    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise click.BadParameter(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    _writable(out)
    summary = generate(out, mode=mode, steps=steps, ranks=ranks, batch=batch, seed=seed, faults=tuple(faults),
                       step_nvtx=step_nvtx)
    click.echo(f"wrote {out}: {summary.describe() if hasattr(summary, 'describe') else summary}")


if __name__ == "__main__":
    main()
