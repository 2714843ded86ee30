"""Every kernel's default config, compiled: Triton's front end carries each loop variable that
changes from one iteration to the next (`autotune_cli.lowering.dropped_loop_carries`).

Ref mode runs a kernel's loops in Python and cannot see this: Triton decides what a loop carries
from one dry pass over its body, so registers shifted through a loop (`x3 = x2; x2 = x1; x1 = new`)
that start as one value keep that value on the GPU, silently (the conv1d slide backward's dx was
wrong on an H100 for this reason). In-process, each kernel in compiled mode for its test.
"""

from __future__ import annotations

import pytest

from autotune_cli import lowering
from autotune_cli.tuning import all_kernels


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_the_default_config_carries_every_changing_loop_variable(name: str):
    tk = all_kernels()[name]
    dims = tk.dims_to_check(lowering.shapes_for(tk, lowering.LOWERING_SHAPES)[0])
    args = lowering.shape_args(tk, dims, "bf16")
    with lowering.compiled_mode(tk.kernel):
        bound = tk.kernel.bind(args)
        assert lowering.dropped_loop_carries(bound, tk.default_for(bound, dims), args) == [], dims
