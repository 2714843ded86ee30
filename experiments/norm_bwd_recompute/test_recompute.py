"""The one-pass gated norm backward (recompute.py) in Helion ref mode on the CPU: its dx, dz, dw,
db and recomputed output against the layer's path (`gated._fwd` then `gated._bwd`), bitwise;
the fused layer's every gradient with `installed()` against without it, bitwise, with one norm
kernel fewer; the timing script's argument errors and its exit without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import recompute
import torch

import mamba_tune
from mamba_tune.layer import split_conv1d_scan as layer
from mamba_tune.norm import gated

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "layer"))
sys.path.insert(0, str(ROOT / "tests"))
from eager_kernels import eager_kernels, smallest_block  # noqa: E402
from layer_inputs import Layer  # noqa: E402


def _layer_conftest():
    """tests/layer/conftest.py, for its `layer_ref_mode` fixture (every kernel the layer calls in ref mode)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("layer_conftest", ROOT / "tests" / "layer" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


layer_ref_mode = _layer_conftest().layer_ref_mode


@pytest.fixture
def ref_mode_small_blocks():
    """The norm kernels in ref mode with the smallest `register_block_size` (several programs'
    dweight partials, as tests/layer/conftest.py's layer_ref_mode)."""
    kernels = [gated.gated_norm_fwd_kernel, gated.gated_norm_bwd_kernel, recompute.gated_norm_bwd_recompute_kernel]
    with eager_kernels(kernels, smallest_block):
        yield


# (rows, d, group_size, has_z, norm_before_gate, has_bias, is_rms, dtype)
CASES = [
    pytest.param((37, 96, 32, True, False, False, True, torch.bfloat16), id="mamba2-form-rms-z-after-bf16"),
    pytest.param((37, 96, 32, True, True, False, True, torch.float32), id="rms-z-before-fp32"),
    pytest.param((20, 48, 48, False, False, False, True, torch.bfloat16), id="rms-no-z"),
    pytest.param((20, 40, 20, True, True, True, False, torch.float16), id="layernorm-z-before-bias-fp16"),
    pytest.param((20, 40, 40, True, False, True, False, torch.bfloat16), id="layernorm-z-after-bias"),
]


@pytest.mark.usefixtures("ref_mode_small_blocks")
@pytest.mark.parametrize("case", CASES)
def test_the_one_pass_equals_the_forward_then_the_backward_bitwise(case):
    rows, d, gs, has_z, nbg, has_bias, rms, dtype = case
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(rows, 3 * d, generator=gen).to(dtype)  # x, z, dy as column slices: a row stride of 3 d
    x, z, dy = wide[:, :d], wide[:, d:2 * d] if has_z else None, wide[:, 2 * d:]
    weight = (torch.randn(d, generator=gen) * 0.1 + 1).to(dtype)
    bias = (torch.randn(d, generator=gen) * 0.1).to(dtype) if has_bias else None
    eps = 1e-5
    out, mean, rstd = gated._fwd(x, z, weight, bias, eps, gs, nbg, rms)
    dz_buf = torch.full((rows, 2 * d), float("nan"), dtype=dtype)  # dz into a strided slice, as the layer's
    want = gated._bwd(dy, x, z, weight, bias, mean, rstd, gs, nbg, rms, dz2=dz_buf[:, :d] if has_z else None)
    dz_buf2 = torch.full_like(dz_buf, float("nan"))
    got = recompute.norm_bwd_recompute(dy, x, z, weight, bias, eps, gs, nbg, rms,
                                       dz2=dz_buf2[:, :d] if has_z else None)
    assert torch.equal(got[4], out), "the recomputed output"
    for name, a, b in zip(("dx", "dz", "dweight", "dbias"), got[:4], want, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs"
    if has_z:
        assert got[1].data_ptr() == dz_buf2.data_ptr() and torch.equal(dz_buf2[:, :d], dz_buf[:, :d])
        assert dz_buf2[:, d:].isnan().all(), "wrote outside dz's slice"


def test_bad_group_size_is_one_line():
    x = torch.zeros(4, 10)
    with pytest.raises(ValueError, match=r"^norm_bwd_recompute: group_size 4 does not divide d=10$"):
        recompute.norm_bwd_recompute(x, x, None, torch.ones(10), None, 1e-5, 4, False, True)


def test_a_borrowed_config_drops_the_per_access_lists():
    cfg = {"block_sizes": [16, 1, 1], "num_warps": 2, "indexing": ["pointer"] * 8, "load_eviction_policies": ["last"],
           "atomic_indexing": [], "pid_type": "flat"}
    assert recompute.borrowed(cfg) == {"block_sizes": [16, 1, 1], "num_warps": 2, "pid_type": "flat"}


def _grads(options: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    lay = Layer.make(dtype, 2, **options)
    leaves = lay.leaves()
    args, kw = lay.call_args(leaves)
    out = mamba_tune.mamba_split_conv1d_scan_combined(*args, **kw)
    dout = torch.randn(*out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    return dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), dout), strict=True))


@pytest.mark.usefixtures("layer_ref_mode")
@pytest.mark.parametrize("options,dtype", [
    pytest.param({"norm_before_gate": False}, torch.bfloat16, id="nemotron-form-bf16"),
    pytest.param({"norm_before_gate": True, "d_mlp": 6, "outproj_bias": False}, torch.float32,
                 id="norm-before-gate-d_mlp-fp32"),
])
def test_the_layer_gradients_with_the_one_pass_equal_those_without_bitwise(tmp_path, options, dtype):
    want = _grads(options, dtype)
    path = tmp_path / "calls.json"
    with recompute.installed(), mamba_tune.record_calls(path):
        assert layer._head_backward is recompute.head_backward
        got = _grads(options, dtype)
    assert layer._head_backward is not recompute.head_backward  # uninstalled
    assert set(got) == set(want) >= {"zxbcdt", "conv1d_weight", "dt_bias", "A", "D", "rmsnorm_weight",
                                     "outproj_weight"}
    for name in want:
        assert torch.equal(got[name], want[name]), f"d{name} changed with the one-pass norm backward"
    calls = {v["kernel"]: v["calls"] for v in json.loads(path.read_text())["calls"].values()}
    # The norm's forward runs once (the layer's forward), the one pass replaces its backward.
    assert (calls.get("gated_norm_fwd"), calls.get("gated_norm_bwd"), calls.get("gated_norm_bwd_recompute")) == \
        (1, None, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_one_pass_on_the_gpu_within_one_rounding():
    """Compiled, the one pass's row sums may take another order than the forward kernel's (another
    tiling): its outputs within one bf16 rounding of the current path's (bitwise: the timing
    script says)."""
    rows, d, gs = 4096, 4096, 512  # Nano's norm rows
    gen = torch.Generator(device="cuda").manual_seed(0)
    wide = torch.randn(rows, 3 * d, generator=gen, device="cuda").to(torch.bfloat16)
    x, z, dy = wide[:, :d], wide[:, d:2 * d], wide[:, 2 * d:]
    w = (torch.randn(d, generator=gen, device="cuda") * 0.1 + 1).to(torch.bfloat16)
    out, _, rstd = gated._fwd(x, z, w, None, 1e-5, gs, False, True)
    want = (*gated._bwd(dy, x, z, w, None, None, rstd, gs, False, True)[:3], out)
    got = recompute.norm_bwd_recompute(dy, x, z, w, None, 1e-5, gs, False, True)
    for name, a, b in zip(("dx", "dz", "dweight", "out"), (*got[:3], got[4]), want, strict=True):
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 2 ** -7 * b.float().abs().max().item(), f"{name}: max difference {err:.3e}"


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "time_recompute.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


@pytest.mark.parametrize("arg,message", [("no-such-model", "unknown preset 'no-such-model'"),
                                         ("zamba2-2.7b/4y2048", "must be BxL"),
                                         ("nemotron-3-nano-30b@3", "TP 3 does not divide")])
def test_the_timing_script_refuses_a_bad_argument_in_one_line(arg, message):
    r = _script("nemotron-3-nano-30b", arg)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr


def test_the_timing_script_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _script("nemotron-3-nano-30b")
    assert r.returncode == 2 and r.stderr.strip().endswith("needs a CUDA GPU"), r.stderr
