"""conv1d test set-up: Helion ref mode for the conv1d kernels on CPU tensors, with small blocks.

`conv_ref_mode` switches the conv1d kernels' settings to ref mode for one test and back
(whatever HELION_INTERPRET said when they were created), and replaces ref mode's one
tile per loop with small blocks: the backward's first kernel registers two block sizes
per call, its positions per program, then its step; they get 8 and 3 (at most the range), so each
program walks several steps with a partial last one, several dweight/dbias partials per
row are summed, and the tests see the masks at block edges. (Only that kernel registers
block sizes, so the calls alternate; the one-kernel backward registers the same two.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from eager_kernels import eager_kernels

from mamba_tune.conv1d import bwd, bwd_slide, fwd, update

SMALL_BLOCKS = (8, 3)  # (positions per program, positions per step)


def _conv_kernels() -> list[Any]:
    return [fwd.causal_conv1d_fwd_kernel, bwd.causal_conv1d_bwd_kernel,
            bwd.causal_conv1d_bwd_dx_kernel, bwd_slide.causal_conv1d_bwd_slide_kernel,
            update.causal_conv1d_update_kernel]


class _SmallBlocks:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, min_or_max: int, max_or_none: int | None = None, /) -> int:
        # register_block_size(max) or register_block_size(min, max).
        lo, hi = (1, min_or_max) if max_or_none is None else (min_or_max, max_or_none)
        size = SMALL_BLOCKS[self.calls % len(SMALL_BLOCKS)]
        self.calls += 1
        return max(lo, min(size, hi))


@pytest.fixture
def conv_ref_mode() -> Iterator[None]:
    with eager_kernels(_conv_kernels(), _SmallBlocks()):
        yield
