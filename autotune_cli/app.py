"""The `mamba-tune` command line. One module per command group in autotune_cli/commands/.

Exit codes: 0 ok; 1 a check failed (a combo failed, a regression, numerics, missing
coverage); 2 bad input (spec, bundle, arguments, environment) with nothing written.
"""

from __future__ import annotations

import typer

from autotune_cli.commands import bench, bundles, plan, review, sweep

app = typer.Typer(
    name="mamba-tune",
    help="Offline autotuning config generator for Helion Mamba-2 kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for group in (plan, sweep, bundles, review, bench):
    group.register(app)


def main() -> None:
    app()
