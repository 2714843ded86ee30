"""`mamba-tune bench`: time the kernels (loaded from bundles) against mamba-ssm."""

from __future__ import annotations

import typer

from autotune_cli.commands.common import Command


def register(app: typer.Typer) -> None:
    from autotune_cli.benchmarks.cli import bench_command

    app.command("bench", cls=Command)(bench_command)
