"""conv1d test set-up: Helion ref mode for the conv1d kernels on CPU tensors, with small blocks.

`conv_ref_mode` switches the conv1d kernels' settings to ref mode for one test and back
(whatever HELION_INTERPRET said when they were created), and makes every
`hl.register_block_size` give 4 (at most its range) instead of ref mode's one tile per
loop: the backward then writes several dweight/dbias partials per row, with a partial
last block, and the tests see the fixed-order reduction and the masks at block edges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helion.language as hl
import pytest
from helion.runtime.ref_mode import RefMode

from mamba_tune import runtime
from mamba_tune.conv1d import causal_conv1d, update

SMALL_BLOCK = 4


def _conv_kernels() -> list[Any]:
    return [causal_conv1d.causal_conv1d_fwd_kernel, causal_conv1d.causal_conv1d_bwd_kernel,
            update.causal_conv1d_update_kernel]


def _small_block(min_or_max: int, max_or_none: int | None = None, /) -> int:
    # register_block_size(max) or register_block_size(min, max).
    lo, hi = (1, min_or_max) if max_or_none is None else (min_or_max, max_or_none)
    return max(lo, min(SMALL_BLOCK, hi))


@pytest.fixture
def conv_ref_mode() -> Iterator[None]:
    kernels = _conv_kernels()
    saved = [k.settings.ref_mode for k in kernels]
    saved_block_ref = hl.register_block_size._ref_fn
    hl.register_block_size._ref_fn = _small_block
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
