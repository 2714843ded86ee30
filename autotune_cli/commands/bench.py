"""`mamba-tune bench`: time the kernels (loaded from bundles) against mamba-ssm;
`mamba-tune results`: docs/results.md from the saved bench results."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from autotune_cli.commands.common import EXIT_CHECK_FAILED, Command, err, fail, os_error_text, out


def results_command(
    results: Annotated[Path, typer.Argument(metavar="DIR", help="Folder of result files (CARD-WHAT.json), "
                                            "e.g. benchmarks/results.", exists=True, file_okay=False)],
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", dir_okay=False,
                                                help="Write the markdown here (default: stdout).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if FILE (-o) differs from "
                                        "what would be written.")] = False,
) -> None:
    """Render the results document (docs/results.md) from `bench --json-out` files: a summary per
    card, the newest figure of each row, and every file's rows, each labelled with its card."""
    from autotune_cli.benchmarks.results import ResultsError, load_results, render

    if check and output is None:
        fail("--check needs -o FILE (the document to compare)")
    try:
        text = render(load_results(results), results.as_posix().rstrip("/"))
    except ResultsError as e:
        fail(str(e))
    if output is None:
        typer.echo(text, nl=False)
        return
    if check:
        try:
            same = output.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            err.print(f"{output} is not what `mamba-tune results {results}` writes: regenerate it", markup=False)
            raise typer.Exit(EXIT_CHECK_FAILED)
        out.print(f"{output} is up to date", markup=False)
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, output)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        fail(f"cannot write {os_error_text(e)}")
    err.print(f"wrote {output}", markup=False)


def register(app: typer.Typer) -> None:
    from autotune_cli.benchmarks.cli import bench_command

    app.command("bench", cls=Command)(bench_command)
    app.command("results", cls=Command)(results_command)
