"""`mamba-tune bench`: time the kernels (loaded from bundles) against mamba-ssm."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from autotune_cli.benchmarks.cli import bench_command

    app.command("bench")(bench_command)
