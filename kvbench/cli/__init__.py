"""The `kvbench` command: a thin Typer layer over the library, one module per command (flags and rendering only).
Heavy imports (torch) happen inside commands, so `kvbench --help` stays fast."""

from __future__ import annotations

import os

import typer

# transformers' GGUF loader draws a tqdm bar it offers no switch for; kvbench shows its own progress.
os.environ.setdefault("TQDM_DISABLE", "1")

from kvbench.cli import compare, cost, env, models, plan, report, run, simulate, trace, validate
from kvbench.cli import map as map_cmd
from kvbench.cli import list as list_cmd
from kvbench.cli.common import Command, Group, out

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure what KV-cache offload really does.",
                  cls=Group)


def _version(value: bool) -> None:
    if value:
        from kvbench.version import __version__

        out.print(f"kvbench {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                 help="Print the version."),
) -> None:
    """Measure what KV-cache offload really does."""


app.command(cls=Command)(run.run)
app.command(cls=Command)(report.report)
app.command(cls=Command)(compare.compare)
app.command(cls=Command)(cost.cost)
app.command("map", cls=Command)(map_cmd.map_)
app.command(cls=Command)(plan.plan)
app.command(cls=Command)(simulate.simulate)
app.command(cls=Command)(validate.validate)
app.command("env", cls=Command)(env.env_)
app.command("list", cls=Command)(list_cmd.list_)
app.add_typer(models.app, name="models")
app.add_typer(trace.app, name="trace")
