"""Shared CLI plumbing: consoles, exit codes, one-line errors."""

from __future__ import annotations

import enum
import sys
from typing import Any, NoReturn

import typer
import typer.core
from rich.console import Console

from mamba_tune.vocab import DTYPES


# Results (tables, JSON) go to stdout; progress and diagnostics to stderr. Piped output
# (CI logs, files) gets a wide fixed width instead of rich's 80-column default.
class _Out(Console):
    def on_broken_pipe(self) -> None:
        # The reader went away (`| head`): it has what it wanted. Rich would exit with code 1;
        # the error goes up to `app.main`, which ends the command quietly with exit code 0.
        self.quiet = True
        raise BrokenPipeError


# No emoji codes: a message like "file.json:100: ..." would print ":100:" as an emoji.
out = _Out(soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False, width=None if sys.stderr.isatty() else 200)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


# --dtype's choices: the dtype names of mamba_tune.vocab.
DtypeChoice = enum.Enum("DtypeChoice", {name: name for name in DTYPES}, type=str)


class EffortChoice(str, enum.Enum):
    none = "none"
    quick = "quick"
    full = "full"


def _tidy(params: list[Any]) -> list[Any]:
    # A flag takes no value: no placeholder (typer would print "<bool>" next to it).
    # An argument is named by its metavar (SPEC, BUNDLE, ...): no "<file>" / "<str>" beside it.
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        elif isinstance(p, typer.core.TyperArgument) and p.metavar is not None:
            p.display_type_rich = lambda ctx: None
    return params


class Command(typer.core.TyperCommand):
    """Every command's class: flags (and --help) show no value placeholder; every option
    that takes a value names it with an explicit `metavar` (SPEC, DIR, FILE, N, ...)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _tidy(super().get_params(ctx))


class Group(typer.core.TyperGroup):
    """The top-level group, tidied the same way (its --help and --version)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _tidy(super().get_params(ctx))


def os_error_text(e: OSError) -> str:
    """One line for a failed file operation: the path and the system's words for it
    (a read-only or full disk, a path under a regular file, a missing permission)."""
    where = e.filename if e.filename is not None else ""
    if e.filename2 is not None:
        where += f" -> {e.filename2}"
    return f"{where}: {e.strerror or e}" if where else str(e.strerror or e)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    raise typer.Exit(code)
