"""The `mamba-tune` command line. One module per command group in autotune_cli/commands/.

Exit codes: 0 ok; 1 a check failed (a combo failed, a regression, numerics, missing
coverage); 2 bad input (spec, bundle, arguments, environment) with nothing written;
130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (a sweep keeps what it finished).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

try:  # `import mamba_tune` checks every MAMBA_TUNE_* variable set: a bad one is bad input (exit 2)
    import mamba_tune  # noqa: F401
except ValueError as e:
    _env = sys.modules.get("mamba_tune.env")
    if _env is None or not isinstance(e, _env.MambaTuneEnvironmentError):
        raise
    sys.stderr.write(f"mamba-tune: {e}\n")
    sys.exit(2)

from autotune_cli.commands import bench, bundles, cluster, plan, review, sweep
from autotune_cli.commands.common import Group

app = typer.Typer(
    name="mamba-tune",
    help="Offline autotuning config generator for Helion Mamba-2 kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def version() -> str:
    """The installed package's version (importlib.metadata); the source's when run uninstalled."""
    import importlib.metadata

    try:
        return importlib.metadata.version("mamba-tune")
    except importlib.metadata.PackageNotFoundError:
        from autotune_cli import __version__

        return f"{__version__} (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"mamba-tune {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                               callback=_print_version, is_eager=True)] = False,
) -> None:
    pass

for group in (plan, sweep, bundles, review, bench, cluster):
    group.register(app)


def main() -> None:
    """Run the CLI; a bad argument or option is one line on stderr and exit code 2. Output
    piped to a reader that stops early (`| head`) ends the command quietly with exit code 0."""
    import click.utils

    try:
        _main()
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(0)
    except SystemExit:
        # Click answers a broken pipe with exit code 1, having wrapped stdout to hush it.
        if isinstance(sys.stdout, click.utils.PacifyFlushWrapper):
            _quiet_stdout()
            sys.exit(0)
        raise


def _quiet_stdout() -> None:
    """Python's own flush of stdout at exit would fail again on the closed pipe: /dev/null."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())


def _main() -> None:
    try:
        rv = app(standalone_mode=False)
    except typer.Abort:
        sys.stderr.write("mamba-tune: aborted\n")
        sys.exit(130)
    except Exception as e:
        # Click's usage and parameter errors (typer vendors click, so match by shape).
        if not (hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int)):
            raise
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "mamba-tune"
        message = " ".join(e.format_message().split())
        if message:  # empty when the help was printed instead (a group called with no command)
            sys.stderr.write(f"{where}: {message} (see {where} --help)\n")
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
