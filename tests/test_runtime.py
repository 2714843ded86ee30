"""Run-time config selection: exact -> nearest -> default, one warning, no search ever."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings

import pytest
import torch
from bundles import H200, bundle, entry, norm_dims

from autotune_cli.tuning import all_kernels
from kernels import runtime
from kernels.bundle import GpuInfo, write_bundle
from kernels.norm.gated import GATED_NORM_BWD, GATED_NORM_FWD


@pytest.fixture
def store_for(tmp_path):
    count = iter(range(1000))

    def make(*bundles, cc="9.0"):
        root = tmp_path / f"store{next(count)}"
        for i, b in enumerate(bundles):
            write_bundle(b, root / b.provenance.gpu.sku / f"b{i}.json")
        messages: list[str] = []
        return runtime.ConfigStore([root], cc, messages.append), messages
    return make


CFG_EXACT = {"block_sizes": [4, 1], "num_warps": 8}
CFG_NEAR = {"block_sizes": [16, 1], "num_warps": 2}


def test_exact_then_nearest_then_default(store_for):
    store, msgs = store_for(bundle(entry(config=CFG_EXACT), entry(dims=norm_dims(rows=4096), config=CFG_NEAR)))
    mode = runtime.Mode.nearest
    exact = store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", mode)
    assert exact.config == CFG_EXACT and exact.source.startswith("exact ")
    # rows 8192: 2x from 16384 and 2x from 4096 -> tie goes to the smaller shape
    near = store.resolve(GATED_NORM_FWD, norm_dims(rows=8192), "bf16", mode)
    assert near.config == CFG_NEAR and near.source.startswith("nearest gated_norm_fwd|")
    near2 = store.resolve(GATED_NORM_FWD, norm_dims(rows=20000), "bf16", mode)
    assert near2.config == CFG_EXACT
    # beyond the 4x bound: default
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=100000), "bf16", mode).config is None
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=512), "bf16", mode).config is None
    # structural dims must match exactly
    assert store.resolve(GATED_NORM_FWD, norm_dims(d=2048), "bf16", mode).config is None
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=8192, has_z=0), "bf16", mode).config is None
    # other dtype, other kernel: default
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "fp16", mode).config is None
    assert store.resolve(GATED_NORM_BWD, norm_dims(), "bf16", mode).config is None
    assert msgs == []


def _scan_dims(**over: int) -> dict[str, int]:
    dims = {"batch": 2, "seqlen": 8192, "nheads": 64, "headdim": 64, "ngroups": 8, "dstate": 128,
            "chunk_size": 128, "has_D": 1, "has_z": 0, "has_seq_idx": 0, "fused_bmm": 0}
    return {**dims, **over}


def test_ssd_nearest_varies_heads_not_groups_or_head_shape(store_for):
    from kernels.ssd.bmm import SSD_BMM
    from kernels.ssd.chunk_scan import SSD_CHUNK_SCAN

    assert SSD_CHUNK_SCAN.size_dims == ("batch", "seqlen", "nheads")
    assert SSD_BMM.size_dims == ("batch", "seqlen")  # F4 has no head dim
    store, msgs = store_for(bundle(entry("ssd_chunk_scan", _scan_dims(), config=CFG_EXACT)))
    mode = runtime.Mode.nearest

    def config(**over: int) -> object:
        return store.resolve(SSD_CHUNK_SCAN, _scan_dims(**over), "bf16", mode).config

    # Nemotron-H 8B (128 heads, 8 groups) and 4x the heads: Nano TP1's entry.
    assert config(nheads=128) == config(nheads=256) == config(nheads=128, seqlen=4096) == CFG_EXACT
    # Beyond 4x, another group count (Nano TP2: 32 heads, 4 groups) or head shape: default.
    assert config(nheads=512) is None
    assert config(nheads=32, ngroups=4) is None and config(nheads=24, ngroups=1) is None
    assert config(headdim=128) is None and config(dstate=256) is None and config(chunk_size=256) is None
    assert config(has_seq_idx=1) is None
    assert msgs == []


def test_modes(store_for):
    store, _ = store_for(bundle(entry(config=CFG_EXACT)))
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=8192), "bf16", runtime.Mode.exact).config is None
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.exact).config == CFG_EXACT
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.default).config is None


def test_other_compute_capability_is_not_used(store_for):
    b200 = GpuInfo(name="NVIDIA B200", sku="b200", arch="sm100", compute_capability="10.0", sm_count=148)
    store, msgs = store_for(bundle(entry(config=CFG_NEAR), gpu=b200), bundle(entry(config=CFG_EXACT)))
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config == CFG_EXACT
    store_b, _ = store_for(bundle(entry(config=CFG_EXACT)), cc="10.0")
    assert store_b.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config is None


def test_stale_kernel_source_warns_and_falls_back(store_for):
    store, msgs = store_for(bundle(entry(config=CFG_EXACT), kernel_hashes={"gated_norm_fwd": "0" * 64}))
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config is None
    assert len(msgs) == 1 and "gated_norm_fwd changed since it was tuned" in msgs[0]


def test_invalid_bundle_warns_once_and_is_skipped(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    write_bundle(bundle(entry(config=CFG_EXACT)), tmp_path / "good.json")
    msgs: list[str] = []
    store = runtime.ConfigStore([tmp_path], "9.0", msgs.append)
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config == CFG_EXACT
    assert len(msgs) == 1 and "bad.json:1: not valid JSON" in msgs[0]


def test_runtime_warns_once_per_missing_key(monkeypatch):
    """The public warn path: one MambaTuneWarning naming the key and the tune command."""
    rt = runtime._Runtime()
    key = "gated_norm_fwd|...|bf16"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            rt.warn_once(f"mamba-tune: no tuned config for {key}; Tune it with: "
                         + runtime.tune_command(GATED_NORM_FWD, norm_dims(), "bf16"))
    assert len(caught) == 1 and issubclass(caught[0].category, runtime.MambaTuneWarning)
    assert "mamba-tune tune gated_norm_fwd --dims rows=16384,d=4096," in str(caught[0].message)


def test_env_mode_override(monkeypatch):
    rt = runtime._Runtime()
    rt.mode = runtime.Mode.exact
    assert rt.effective_mode() is runtime.Mode.exact
    monkeypatch.setenv(runtime.ENV_MODE, "default")
    assert rt.effective_mode() is runtime.Mode.default


def test_committed_bundles_load_for_their_gpu():
    """Every committed bundle is valid and indexes under its own compute capability."""
    from kernels.bundle import find_bundles, load_bundle

    paths = find_bundles(runtime.default_bundle_paths())
    for p in paths:
        b = load_bundle(p)
        store = runtime.ConfigStore([p], b.provenance.gpu.compute_capability, pytest.fail)
        for e in b.entries.values():
            tk = all_kernels()[e.kernel]
            assert store.resolve(tk, e.dims, e.dtype, runtime.Mode.exact).config == e.config


def test_every_runtime_kernel_refuses_to_autotune():
    for tk in all_kernels().values():
        assert tk.kernel.settings.autotuner_fn is runtime.refuse_autotune, tk.name


def test_autotune_raises_in_compiled_mode(clean_env):
    """In compiled mode (as on a GPU) asking the runtime kernel to search raises at once."""
    code = (
        "import torch\n"
        "from autotune_cli.tuning.norm import GATED_NORM_FWD as tk\n"
        "from kernels.runtime import RuntimeAutotuneError\n"
        "p = tk.make_problem(dict(rows=8, d=64, group_size=32, has_z=1, norm_before_gate=0, has_bias=0,"
        " is_rms=1, weight_fp32=1), torch.bfloat16, torch.device('cpu'), 0)\n"
        "try:\n    tk.kernel.bind(p.args).autotune(p.args)\nexcept RuntimeAutotuneError:\n    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=clean_env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "refused", out.stderr[-2000:]


def test_lookup_after_first_call_is_cheap():
    """The cached path is a signature tuple and a dict lookup (the GPU figure is in the README)."""
    x = torch.randn(64, 2, 32, dtype=torch.bfloat16)
    w = torch.ones(2, 32)
    args = (x, x, w, None, 1e-6, False, True)
    runtime.run(GATED_NORM_FWD, args)
    fn = runtime.lookup(GATED_NORM_FWD, args)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        assert runtime.lookup(GATED_NORM_FWD, args) is fn
    per_us = (time.perf_counter() - t0) * 1e6 / n
    assert per_us < 20, f"{per_us:.2f} us per lookup"


def test_h200_fixture_matches_presets():
    from autotune_cli.presets import sku_of

    assert sku_of(H200.name) == "h200" and sku_of("NVIDIA GH200 480GB") == "gh200"


def test_signature_separates_what_compiled_code_bakes_in():
    x = torch.randn(4, 6, 8)
    sig = runtime._signature
    assert sig((x, 1e-6, True)) == sig((torch.randn(4, 6, 8), 1e-6, True))
    # Shape, dtype, strides of a non-contiguous view, scalars and None all change the key.
    assert sig((x,)) != sig((torch.randn(4, 6, 9),))
    assert sig((x,)) != sig((x.to(torch.bfloat16),))
    assert sig((x.transpose(1, 2).contiguous(),)) != sig((x.transpose(1, 2),))
    assert sig((x[:, :, ::2],)) != sig((x[:, :, 1::2].contiguous(),))
    assert sig((x, None)) != sig((x, x))
    assert sig((x, 1e-6)) != sig((x, 1e-5))
