"""Every MAMBA_TUNE_* environment variable, its allowed values and its one parser.

`import mamba_tune` checks every MAMBA_TUNE_* variable that is set (`check`): a value outside its
allowed values, or a name that is no mamba-tune variable (a typo, a switch that was removed),
raises `MambaTuneEnvironmentError` with one line naming the variable and what it allows. Where a
variable is used, `read` parses it with the same parser (a test may set it after the import). An
empty value is the same as unset. The `mamba-tune` CLI reports the error as bad input (exit 2).

The code-path overrides (MAMBA_TUNE_SSD_SP_BWD, MAMBA_TUNE_SSD_DBDC) are registered by the registry of
per-shape choices, mamba_tune.paths, which `import mamba_tune` loads before the check. Standard
library only: the check costs no torch import.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREFIX = "MAMBA_TUNE_"
CONFIGS = "MAMBA_TUNE_CONFIGS"
CONFIG_MODE = "MAMBA_TUNE_CONFIG_MODE"
PATCH_MAMBA_SSM = "MAMBA_TUNE_PATCH_MAMBA_SSM"
PATCH_TRANSFORMERS = "MAMBA_TUNE_PATCH_TRANSFORMERS"
RECORD = "MAMBA_TUNE_RECORD"
SEARCH_LOG = "MAMBA_TUNE_SEARCH_LOG"
GIT_SHA = "MAMBA_TUNE_GIT_SHA"


class MambaTuneEnvironmentError(ValueError):
    """A MAMBA_TUNE_* variable with a value it does not allow, or no such variable."""


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    # One line: the allowed values (what the error says).
    allowed: str
    # The value, parsed; raises ValueError (with a reason, or empty) for a value not allowed.
    parse: Callable[[str], Any]
    # What reads it and what it does (docs/paths.md's table).
    doc: str


def _choice(*values: str, lower: bool = False) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower() if lower else raw
        if value not in values:
            raise ValueError
        return value

    return parse


def _flag(raw: str) -> bool:
    return _choice("0", "1")(raw) == "1"


def _bundle_paths(raw: str) -> list[Path]:
    paths = [Path(p) for p in raw.split(os.pathsep) if p]
    for p in paths:
        if not p.exists():
            raise ValueError(f"{p} does not exist")
        if not p.is_dir() and p.suffix != ".json":
            raise ValueError(f"{p} is neither a folder nor a .json bundle")
    return paths


def _record_file(raw: str) -> Path:
    if raw.endswith(("/", os.sep)) or Path(raw).is_dir():
        raise ValueError(f"{raw} is a folder")
    return Path(raw)


def _commit(raw: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", raw):
        raise ValueError
    return raw


_OWN = (
    Variable(CONFIGS, "bundle files (.json) or folders of <sku>/<name>.json that exist, separated by "
             f"'{os.pathsep}'", _bundle_paths,
             "where the runtime reads bundles, instead of the installed `generated_configs`"),
    Variable(CONFIG_MODE, "exact, nearest or default", _choice("exact", "nearest", "default"),
             "the runtime's lookup mode, over `mamba_tune.configure(mode=...)`"),
    Variable(PATCH_MAMBA_SSM, "0, 1 or strict", _choice("0", "1", "strict", lower=True),
             "patch mamba-ssm at `import mamba_tune` (strict: raise where a call cannot be served)"),
    Variable(PATCH_TRANSFORMERS, "0, 1 or strict", _choice("0", "1", "strict", lower=True),
             "patch transformers' Mamba-2 mixers at `import mamba_tune`"),
    Variable(RECORD, "a file path (not a folder)", _record_file,
             "record every kernel key the process calls into this file, from `import mamba_tune` on"),
    Variable(SEARCH_LOG, "0 or 1", _flag,
             "`mamba-tune sweep`, `tune`: 0 writes no search trace"),
    Variable(GIT_SHA, "a commit hash (7-40 lowercase hex digits, -dirty allowed)", _commit,
             "`mamba-tune sweep`, `tune`: the commit a bundle's provenance names, for a tree without .git"),
    Variable("MAMBA_TUNE_REQUIRE_SLURM", "0 or 1", _flag,
             "the test suite: 1 fails the Slurm tests where the daemons are missing, instead of skipping them"),
)


# Variables that selected code paths since deleted (measured slower, or experiment knobs): setting
# one is an error that says so, not a silent no-op.
REMOVED = {
    "MAMBA_TUNE_SSD_DBDC_SIDES": "dC and dB always run in programs of their own (faster at every shape measured)",
    "MAMBA_TUNE_SSD_DBDC_SPLITS": "the dB/dC kernel's head runs follow their rule (experiments patch head_splits)",
    "MAMBA_TUNE_UNSAFE_GPU_SEQ_IDX": "the fused chunk scan it unlocked with seq_idx on a GPU (C B^T inside "
                                     "F5, measured slower) is deleted; F4 then F5 always run",
    "MAMBA_TUNE_CONV1D_BWD": "the conv1d backward is the slide kernel for channel-last calls and the two "
                             "kernels for the rest (mamba_tune.conv1d.bwd_slide.fits)",
    "MAMBA_TUNE_SSD_DBDC_SUM": "torch adds the dB/dC head runs; the one-kernel fold (not promoted) is "
                               "experiments/dbdc_runs_sum/",
}


# The code-path overrides, registered by mamba_tune.paths (which `import mamba_tune` loads first).
_REGISTERED: dict[str, Variable] = {}


def register_choice(name: str, choices: tuple[str, ...], doc: str) -> None:
    """Declare variable `name`, allowed one of `choices` (mamba_tune.paths calls this per choice)."""
    _REGISTERED[name] = Variable(name, " or ".join(", ".join(choices).rsplit(", ", 1)), _choice(*choices), doc)


def variables() -> dict[str, Variable]:
    """Every MAMBA_TUNE_* variable by name: the runtime's and the CLI's, then the code-path overrides."""
    return {**{v.name: v for v in _OWN}, **_REGISTERED}


def parse(name: str, raw: str) -> Any:
    """`raw` as variable `name` allows it (None for an empty value); MambaTuneEnvironmentError otherwise."""
    known = variables()
    var = known.get(name)
    if name in REMOVED:
        raise MambaTuneEnvironmentError(f"{name}: removed; {REMOVED[name]}. Unset it")
    if var is None:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise MambaTuneEnvironmentError(f"{name}: no such mamba-tune variable{hint}; the variables are in "
                                        "docs/paths.md")
    if raw == "":
        return None
    try:
        return var.parse(raw)
    except ValueError as e:
        why = f": {e}" if str(e) else ""
        raise MambaTuneEnvironmentError(f"{name}={raw!r}{why}; expected {var.allowed}") from None


def read(name: str) -> Any:
    """The parsed value of variable `name` now (None when unset or empty)."""
    return parse(name, os.environ.get(name, ""))


def check() -> None:
    """Every MAMBA_TUNE_* variable set, parsed (`import mamba_tune` runs this)."""
    for name in sorted(os.environ):
        if name.startswith(PREFIX):
            parse(name, os.environ[name])


def markdown() -> str:
    """docs/paths.md's table of the variables."""
    rows = ["| variable | allowed values | what |", "|---|---|---|"]
    for v in variables().values():
        allowed = v.allowed.replace("<", "&lt;").replace(">", "&gt;")
        rows.append(f"| `{v.name}` | {allowed} | {v.doc} |")
    return "\n".join(rows) + "\n"
