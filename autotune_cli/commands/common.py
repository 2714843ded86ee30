"""Shared CLI plumbing: consoles, exit codes, one-line errors."""

from __future__ import annotations

import enum
import sys
from typing import NoReturn

import typer
from rich.console import Console

from kernels.vocab import DTYPES

# Results (tables, JSON) go to stdout; progress and diagnostics to stderr. Piped output
# (CI logs, files) gets a wide fixed width instead of rich's 80-column default.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, highlight=False, width=None if sys.stderr.isatty() else 200)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


# --dtype's choices: the dtype names of kernels.vocab.
DtypeChoice = enum.Enum("DtypeChoice", {name: name for name in DTYPES}, type=str)


class EffortChoice(str, enum.Enum):
    none = "none"
    quick = "quick"
    full = "full"


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    raise typer.Exit(code)
