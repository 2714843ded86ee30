"""Layer test set-up: every kernel the layer calls (conv1d, SSD, gated norm) in Helion ref mode.

As tests/ssd/conftest.py's `ssd_ref_mode`, for all the tuned kernels at once: their bodies
run eagerly on CPU tensors, and every `hl.register_block_size` takes its smallest allowed
value, so the multi-tile paths (tile-edge masks, carries across blocks) run too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eager_kernels import eager_kernels, smallest_block

from autotune_cli.tuning import all_kernels
from mamba_tune.conv1d import bwd, bwd_slide, fwd


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
    with eager_kernels(kernels, smallest_block if blocks == "min" else None):
        yield
