"""Shared CLI plumbing: consoles, exit codes, one-line errors."""

from __future__ import annotations

import enum
from typing import NoReturn

import typer
from rich.console import Console

# Results (tables, JSON) go to stdout; progress and diagnostics to stderr.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True, highlight=False)

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


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(code)
