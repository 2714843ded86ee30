"""Run-time config selection: exact -> nearest -> default, one warning, no search ever."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from bundles import B200, H200, bundle, entry, norm_dims, running_on

from autotune_cli.tuning import all_kernels
from mamba_tune import runtime
from mamba_tune.bundle import write_bundle
from mamba_tune.norm.gated import GATED_NORM_BWD, GATED_NORM_FWD


@pytest.fixture
def store_for(tmp_path):
    count = iter(range(1000))

    def make(*bundles, gpu=H200):
        root = tmp_path / f"store{next(count)}"
        for i, b in enumerate(bundles):
            write_bundle(b, root / b.provenance.gpu.sku / f"b{i}.json")
        messages: list[str] = []
        return runtime.ConfigStore([root], running_on(gpu), messages.append), messages
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
            "chunk_size": 128, "has_D": 1, "has_z": 0, "has_seq_idx": 0}
    return {**dims, **over}


def test_ssd_nearest_varies_heads_not_groups_or_head_shape(store_for):
    from mamba_tune.ssd.bmm import SSD_BMM
    from mamba_tune.ssd.chunk_scan import SSD_CHUNK_SCAN

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


def test_bench_config_modes_are_the_runtime_modes():
    from autotune_cli.benchmarks.cli import ConfigMode

    assert [m.value for m in ConfigMode] == [m.value for m in runtime.Mode]


def test_other_compute_capability_is_not_used(store_for):
    store, msgs = store_for(bundle(entry(config=CFG_NEAR), gpu=B200), bundle(entry(config=CFG_EXACT)))
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config == CFG_EXACT
    store_b, _ = store_for(bundle(entry(config=CFG_EXACT)), gpu=B200)
    assert store_b.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config is None


def test_stale_kernel_source_warns_and_falls_back(store_for):
    store, msgs = store_for(bundle(entry(config=CFG_EXACT), kernel_hashes={"gated_norm_fwd": "0" * 64}))
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config is None
    assert len(msgs) == 1 and "gated_norm_fwd changed since it was tuned" in msgs[0]


def test_invalid_bundle_warns_once_and_is_skipped(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    write_bundle(bundle(entry(config=CFG_EXACT)), tmp_path / "good.json")
    msgs: list[str] = []
    store = runtime.ConfigStore([tmp_path], running_on(H200), msgs.append)
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config == CFG_EXACT
    assert len(msgs) == 1 and "bad.json:1:2: not valid JSON: expecting property name" in msgs[0]


def test_unreadable_bundle_files_warn_and_are_skipped(tmp_path):
    """Whatever is wrong with a bundle file, the loader warns and skips it: a training job
    never sees an exception from a config file."""
    write_bundle(bundle(entry(config=CFG_EXACT)), tmp_path / "good.json")
    (tmp_path / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "twice.json").write_text((tmp_path / "good.json").read_text().replace(
        '"schema_version": 1', '"schema_version": 1, "schema_version": 1'))
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    msgs: list[str] = []
    store = runtime.ConfigStore([tmp_path], running_on(H200), msgs.append)
    assert store.resolve(GATED_NORM_FWD, norm_dims(), "bf16", runtime.Mode.nearest).config == CFG_EXACT
    got = sorted(m.split(str(tmp_path) + "/")[1] for m in msgs)
    assert got == ["binary.json:1: not UTF-8 text (byte 0: b'\\x89')",
                   "dangling.json: cannot read: No such file or directory",
                   "deep.json: nested too deeply to be a bundle",
                   "folder.json: cannot read: Is a directory",
                   "twice.json: duplicate key 'schema_version' in one JSON object"], msgs


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
    from mamba_tune.bundle import find_bundles, load_bundle

    paths = find_bundles(runtime.default_bundle_paths())
    for p in paths:
        b = load_bundle(p)
        store = runtime.ConfigStore([p], running_on(b.provenance.gpu), pytest.fail)
        for e in b.entries.values():
            tk = all_kernels()[e.kernel]
            assert store.resolve(tk, e.dims, e.dtype, runtime.Mode.exact).config == e.config


@pytest.mark.parametrize("package", [False, True], ids=["folder", "package"])
def test_shipped_bundles_found_from_a_folder_holding_generated_configs(tmp_path, package):
    """Run from where `mamba-tune sweep` wrote its bundles (./generated_configs/, a package
    only if copied from the repository): the runtime reads the installed bundles, which a
    plain `import generated_configs` would miss (the editable install's finder comes after
    the working directory)."""
    stray = tmp_path / "generated_configs"
    write_bundle(bundle(entry(config=CFG_EXACT)), stray / "h200" / "mine.json")
    if package:
        (stray / "__init__.py").write_text("")
    env = {n: v for n, v in os.environ.items() if n not in ("PYTHONPATH", runtime.ENV_CONFIGS)}
    code = "from mamba_tune import runtime; print(*runtime.default_bundle_paths())"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # The checkout's (the editable install's) bundles, not the working directory's.
    assert r.stdout.split() == [str(Path(__file__).resolve().parents[2] / "generated_configs")]


def test_every_runtime_kernel_refuses_to_autotune():
    for tk in all_kernels().values():
        assert tk.kernel.settings.autotuner_fn is runtime.refuse_autotune, tk.name


def test_autotune_raises_in_compiled_mode(clean_env):
    """In compiled mode (as on a GPU) asking the runtime kernel to search raises at once."""
    code = (
        "import torch\n"
        "from autotune_cli.tuning.norm import GATED_NORM_FWD as tk\n"
        "from mamba_tune.runtime import RuntimeAutotuneError\n"
        "p = tk.make_problem(dict(rows=8, d=64, group_size=32, has_z=1, norm_before_gate=0, has_bias=0,"
        " is_rms=1, weight_fp32=1), torch.bfloat16, torch.device('cpu'), 0)\n"
        "try:\n    tk.kernel.bind(p.args).autotune(p.args)\nexcept RuntimeAutotuneError:\n    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=clean_env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "refused", out.stderr[-2000:]


def test_lookup_after_first_call_is_cheap():
    """The cached path is a signature tuple and a dict lookup (on a GPU `mamba-tune bench` times it: `lookup_us` in its result files)."""
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
    from mamba_tune.sku import sku_of

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


# --- CPU use, rejected configs and exception safety -----------------------------------

NORM_CALL = """
import torch
from mamba_tune import runtime
from mamba_tune.norm.gated import GATED_NORM_FWD
x = torch.randn(64, 2, 32, dtype=torch.bfloat16)
w = torch.ones(2, 32)
args = (x, x, w, None, 1e-6, False, True)
"""


def _run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_cpu_call_without_ref_mode_raises_one_clear_error(clean_env):
    """Compiled mode on CPU tensors: one error naming both ways out, before any tune warning."""
    code = NORM_CALL + """
import warnings
warnings.simplefilter("error")  # a tune warning first would surface instead
try:
    runtime.run(GATED_NORM_FWD, args)
except runtime.NoDeviceError as e:
    print(e)
"""
    r = _run_python(code, clean_env)
    assert r.returncode == 0, r.stderr[-3000:]
    msg = r.stdout.strip()
    assert msg.startswith("gated_norm_fwd: tensors on cpu:"), msg
    assert "CUDA GPU" in msg and "HELION_INTERPRET=1 before importing mamba_tune" in msg and "ref mode" in msg


def test_ref_mode_says_once_that_bundles_do_not_apply(caplog):
    x = torch.randn(8, 2, 32, dtype=torch.bfloat16)
    args = (x, x, torch.ones(2, 32), None, 1e-6, False, True)
    runtime.configure()
    with caplog.at_level("WARNING", logger="mamba_tune"):
        runtime.run(GATED_NORM_FWD, args)
        runtime.run(GATED_NORM_FWD, (x[:4], x[:4], *args[2:]))
    said = [r.getMessage() for r in caplog.records if "ref mode" in r.getMessage()]
    assert len(said) == 1 and "tuned configs from bundles do not apply" in said[0]


def test_failed_ref_mode_call_leaves_the_process_as_it_found_it(clean_env):
    """Meta tensors fail inside Helion's ref-mode set-up; the next call must still work."""
    code = NORM_CALL + """
from helion.runtime.ref_mode import RefModeContext
good = runtime.run(GATED_NORM_FWD, args)[0]
for bad in ((x.to("meta"), x.to("meta"), w.to("meta"), *args[3:]), (x, x, w[:, :16], *args[3:])):
    try:
        runtime.run(GATED_NORM_FWD, bad)
        raise SystemExit("the bad call passed")
    except Exception as e:
        print(type(e).__name__)
    assert not RefModeContext.has_current()
    assert torch.zeros(1).device.type == "cpu"
    again = runtime.run(GATED_NORM_FWD, args)[0]
    assert torch.equal(again, good)
print("ok")
"""
    r = _run_python(code, {**clean_env, "HELION_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.split()[-1] == "ok"


# Values the bundle schema allows but this kernel's config space does not (a value no config
# may hold never gets this far: tests/runtime/test_bundle_config_safety.py).
BAD_CONFIGS = {64: {"load_eviction_policies": ["first"] * 9}, 32: {"block_sizes": [4, 1, 1]},
               16: {"indexing": ["pointer"]}}


def test_rejected_bundle_configs_warn_once_and_run_the_default(tmp_path, clean_env):
    """Compiled mode, as on a GPU (the CPU can compile but not launch): a config Helion
    rejects (a list of the wrong length for the kernel) is served as `exact`, warned
    about once, and the kernel's default config runs instead."""
    entries = [entry(dims=norm_dims(rows=rows, d=64, group_size=32), config={"block_sizes": [4, 1], "num_warps": 4, **bad})
               for rows, bad in BAD_CONFIGS.items()]
    write_bundle(bundle(*entries), tmp_path / "bad.json")
    code = NORM_CALL + f"""
import warnings
runtime._check_device = lambda rk, args: None  # no GPU here: compile, never launch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for rows in {list(BAD_CONFIGS)}:
        call = (x[:rows], x[:rows], *args[2:])
        assert callable(runtime.lookup(GATED_NORM_FWD, call))
        runtime._RT.compiled.clear()  # compile again: the warning stays one
        runtime.lookup(GATED_NORM_FWD, call)
for w in caught:
    if issubclass(w.category, runtime.MambaTuneWarning):
        print("W", w.message)
for source in runtime.resolutions().values():
    print("R", source)
"""
    r = _run_python(code, {**clean_env, runtime.ENV_CONFIGS: str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    warned = [line for line in r.stdout.splitlines() if line.startswith("W ")]
    assert len(warned) == 3, r.stdout
    for rows, line in zip(BAD_CONFIGS, warned):
        assert "Helion rejects the config for gated_norm_fwd|d=64,group_size=32," in line
        assert f"rows={rows}" in line and "bad.json" in line and ("InvalidConfig: " in line or "ConfigError: " in line)
        assert "running the kernel's default config" in line
    sources = [line for line in r.stdout.splitlines() if line.startswith("R ")]
    assert len(sources) == 3 and all("default (config rejected: exact" in s for s in sources), r.stdout
