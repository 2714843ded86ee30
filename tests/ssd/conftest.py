"""SSD test set-up: Helion ref mode for the SSD kernels on CPU tensors.

Two things make the kernel bodies run eagerly on CPU, whatever the session's mode:

- `ssd_ref_mode` switches the SSD kernels' own settings to ref mode for one test and back
  (Helion reads HELION_INTERPRET once, when a kernel is created; tests/conftest.py sets it
  on machines without CUDA, this fixture makes the SSD tests independent of that).
- Ref mode gives every `hl.register_block_size` its largest value (one tile per loop), so
  the multi-tile paths (masks at tile edges, the causal column loop, the scan's carry
  from one block of chunks to the next) would never run. `ssd_ref_mode` gives each its
  smallest allowed value instead ("min", the default); `indirect` parametrization with
  "max" keeps Helion's choice.

helion 1.5.0's ref-mode `hl.dot` has no CPU path of its own: the tests run the product's
(`kernels/ref_mode.py`, installed when the SSD kernels are imported).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from eager_kernels import eager_kernels, smallest_block

from autotune_cli.tuning import all_kernels


def _ssd_kernels() -> list[Any]:
    # The tunable kernels, and the two-pass dB/dC form's (not tunable yet: no tuning records).
    from mamba_tune.ssd import dbdc_two_pass

    return [*(tk.kernel for name, tk in all_kernels().items() if tk.family == "ssd"), dbdc_two_pass.dcb_kernel,
            dbdc_two_pass.dbdc_kernel]


@pytest.fixture
def ssd_ref_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the SSD kernels in Helion ref mode for this test (their bodies eagerly, on CPU),
    with the smallest block sizes ("min", default) or Helion's ref-mode choice ("max")."""
    blocks = getattr(request, "param", "min")
    if blocks not in ("min", "max"):
        raise ValueError(f"ssd_ref_mode: blocks must be 'min' or 'max', got {blocks!r}")
    with eager_kernels(_ssd_kernels(), smallest_block if blocks == "min" else None):
        yield blocks
