"""Every tuning problem's arguments are fully defined after one run of its kernel.

Helion's search checks each candidate config against the default config's run, comparing the
outputs and every argument the kernel writes, in full. A buffer the problem allocates with
torch.empty and the kernel writes only in part holds garbage where no config writes, and which
entries those are depends on the block sizes: on the H200 that rejected all 14 first
configs of 47B's first dB/dC pass (its S buffer is written only where j <= l), so the search
timed nothing. Here, in Helion's ref mode on the CPU with torch.empty returning NaN (nan_empty),
each record's kernel runs once on its problem and no floating argument may keep a NaN.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.tuning import all_kernels, get
from mamba_tune import runtime
from mamba_tune.keys import ModelShape

pytestmark = pytest.mark.usefixtures("nan_empty")

# Each kernel runs at the first of these its key has dims for: small sizes with a partial last
# chunk; dstate 256 (B5-B8 in two passes); 64 heads x batch (the one-walk state passing backward).
SHAPES = (
    ModelShape(batch=2, seqlen=80, nheads=4, headdim=24, ngroups=2, dstate=24, chunk_size=32),
    ModelShape(batch=2, seqlen=80, nheads=4, headdim=24, ngroups=2, dstate=256, chunk_size=32),
    ModelShape(batch=2, seqlen=80, nheads=32, headdim=16, ngroups=2, dstate=16, chunk_size=32),
)


def _dims(name: str) -> dict[str, int]:
    for shape in SHAPES:
        dims = get(name).dims_to_check(shape)
        if dims is not None:
            return dims
    raise AssertionError(f"{name}: no dims at any of the test's shapes; add one")


# Option flags of the keys, set to 1 in the "flags-on" cases (z, seq_idx, states, bias, ...).
FLAG_DIMS = ("dt_softplus", "silu", "fp32_state", "tie_hdim")


@pytest.mark.parametrize("flags", [0, 1], ids=["flags-off", "flags-on"])
@pytest.mark.parametrize("name", all_kernels())
def test_no_argument_keeps_an_unwritten_entry(name: str, flags: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELION_INTERPRET", "1")
    tk = get(name)
    dims = _dims(name)
    if flags:
        dims = {k: 1 if k.startswith("has_") or k in FLAG_DIMS else v for k, v in dims.items()}
    problem = tk.make_problem(dims, torch.bfloat16, torch.device("cpu"), 0)
    problem.run(lambda *args: runtime.run(tk.runtime, args))
    unwritten = {i: f"{tuple(a.shape)}: {int(a.isnan().sum())} NaN" for i, a in enumerate(problem.args)
                 if isinstance(a, torch.Tensor) and a.is_floating_point() and a.isnan().any()}
    assert not unwritten, f"{name}: arguments with entries no run wrote (by position): {unwritten}"
