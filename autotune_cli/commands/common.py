"""Shared CLI plumbing: consoles, exit codes, one-line errors."""

from __future__ import annotations

import enum
import sys
from typing import NoReturn

import typer
from rich.console import Console

# Results (tables, JSON) go to stdout; progress and diagnostics to stderr. Piped output
# (CI logs, files) gets a wide fixed width instead of rich's 80-column default.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, highlight=False, width=None if sys.stderr.isatty() else 200)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


class DtypeChoice(str, enum.Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class EffortChoice(str, enum.Enum):
    none = "none"
    quick = "quick"
    full = "full"


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
