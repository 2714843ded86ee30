"""Layer test set-up: every kernel the layer calls (conv1d, SSD, gated norm) in Helion ref mode.

As tests/ssd/conftest.py's `ssd_ref_mode`, for all the tuned kernels at once: their bodies
run eagerly on CPU tensors, and every `hl.register_block_size` takes its smallest allowed
value, so the multi-tile paths (tile-edge masks, carries across blocks) run too.
"""

from __future__ import annotations

from collections.abc import Iterator

import helion.language as hl
import pytest
from helion.runtime.ref_mode import RefMode

from autotune_cli.tuning import all_kernels
from mamba_tune import runtime
from mamba_tune.conv1d import bwd, bwd_slide, fwd


def _smallest_block(min_or_max: int, max_or_none: int | None = None, /) -> int:
    # register_block_size(max) allows 1; register_block_size(min, max) allows min.
    return 1 if max_or_none is None else min_or_max


@pytest.fixture
def layer_ref_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Ref mode with the smallest block sizes ("min", the default) or Helion's ref-mode choice
    ("max", through indirect parametrization: one tile per loop, for tests that need the calls,
    not the multi-tile paths)."""
    blocks = getattr(request, "param", "min")
    if blocks not in ("min", "max"):
        raise ValueError(f"layer_ref_mode: blocks must be 'min' or 'max', got {blocks!r}")
    # The conv1d kernels by name too: the layer calls them whether or not they have tuning records.
    rks = [*all_kernels().values(), fwd.CAUSAL_CONV1D_FWD, bwd.CAUSAL_CONV1D_BWD,
           bwd.CAUSAL_CONV1D_BWD_DX, bwd_slide.CAUSAL_CONV1D_BWD_SLIDE]
    kernels = list({id(rk.kernel): rk.kernel for rk in rks}.values())
    saved = [k.settings.ref_mode for k in kernels]
    saved_block_ref = hl.register_block_size._ref_fn
    if blocks == "min":
        hl.register_block_size._ref_fn = _smallest_block
    for k in kernels:
        k.settings.ref_mode = RefMode.EAGER
        k.reset()
    runtime.configure()  # drop callables compiled in the other mode
    try:
        yield
    finally:
        hl.register_block_size._ref_fn = saved_block_ref
        for k, mode in zip(kernels, saved, strict=True):
            k.settings.ref_mode = mode
            k.reset()
        runtime.configure()
