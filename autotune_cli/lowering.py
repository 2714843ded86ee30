"""Check on the CPU that configs still lower: Helion's real compiler front end, no GPU."""

from __future__ import annotations

import os
from typing import Any

import torch

from kernels.bundle import Bundle
from kernels.registry import DTYPES, TunableKernel, all_kernels


def lower(tk: TunableKernel, dims: dict[str, int], dtype: str, config: dict[str, Any] | None) -> str:
    """Generated Triton source for `config` (None: Helion's default config) at `dims`."""
    import helion

    if os.environ.get("HELION_INTERPRET") == "1":
        raise RuntimeError("lowering needs compiled mode: unset HELION_INTERPRET")
    problem = tk.make_problem(dims, DTYPES[dtype], torch.device("cpu"), 0)
    bound = tk.kernel.bind(problem.args)
    cfg = bound.config_spec.default_config() if config is None else helion.Config.from_dict(config)
    return bound.to_triton_code(cfg)


def lower_bundle(bundle: Bundle) -> list[tuple[str, str]]:
    """(key, error) for every entry whose config no longer lowers; empty when all do."""
    kernels = all_kernels()
    problems: list[tuple[str, str]] = []
    for key, entry in bundle.entries.items():
        tk = kernels.get(entry.kernel)
        if tk is None:
            problems.append((key, f"unknown kernel {entry.kernel!r}"))
            continue
        try:
            lower(tk, entry.dims, entry.dtype, entry.config)
        except Exception as e:  # any compiler error is a finding, reported per entry
            problems.append((key, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))
    return problems
