"""Per-SKU bundle lookup (mamba_tune.store): the running SKU's bundles before a sibling's,
whatever the path order; a sibling's entry reported as one; a GPU with no bundle warned
about once and run on default configs. No GPU here: tests fake the device through the
runtime's one seam that reads it (`runtime.read_gpu`), and the selection runs for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bundles import B200, H100, H200, bundle, entry, norm_dims, running_on

import mamba_tune
from autotune_cli.from_record import combos_from_record
from mamba_tune import runtime
from mamba_tune.bundle import GpuInfo, write_bundle
from mamba_tune.norm.gated import GATED_NORM_FWD
from mamba_tune.sku import Gpu, sku_of

A100 = GpuInfo(name="NVIDIA A100-SXM4-80GB", sku="a100", arch="sm80", compute_capability="8.0", sm_count=108)
CFG_H100 = {"block_sizes": [2, 1], "num_warps": 2}
CFG_H100_NEAR = {"block_sizes": [4, 1], "num_warps": 2}
CFG_H200 = {"block_sizes": [8, 1], "num_warps": 4}
CFG_H200_ONLY = {"block_sizes": [16, 1], "num_warps": 8}
MODE = runtime.Mode.nearest


def _write_pair(root: Path, order: str) -> tuple[list[Path], Path]:
    """An h100 and an h200 bundle: the bundle paths to read, in the given order (by folder
    order or, in one folder, by file name), and the h200 bundle's file."""
    h100 = bundle(entry(config=CFG_H100), entry(dims=norm_dims(rows=4096), config=CFG_H100_NEAR), gpu=H100)
    h200 = bundle(entry(config=CFG_H200), entry(dims=norm_dims(rows=8192), config=CFG_H200),
                  entry(dims=norm_dims(rows=131072), config=CFG_H200_ONLY), gpu=H200)
    if order in ("h100 first", "h200 first"):
        write_bundle(h100, root / "h100" / "x.json")
        write_bundle(h200, root / "h200" / "x.json")
        folders = [root / "h100", root / "h200"]
        return (folders if order == "h100 first" else folders[::-1]), root / "h200" / "x.json"
    # One folder, read in file-name order: the sibling's file sorts first or last.
    first, second = (h100, h200) if order == "one folder, h100 file first" else (h200, h100)
    write_bundle(first, root / "mixed" / "a.json")
    write_bundle(second, root / "mixed" / "b.json")
    return [root / "mixed"], root / "mixed" / ("a.json" if first is h200 else "b.json")


ORDERS = ["h100 first", "h200 first", "one folder, h100 file first", "one folder, h200 file first"]


@pytest.mark.parametrize("order", ORDERS)
def test_own_sku_before_sibling_whatever_the_path_order(tmp_path: Path, order: str) -> None:
    paths, h200_file = _write_pair(tmp_path, order)
    msgs: list[str] = []
    on_h100 = runtime.ConfigStore(paths, running_on(H100), msgs.append)
    on_h200 = runtime.ConfigStore(paths, running_on(H200), msgs.append)

    def on(store: runtime.ConfigStore, rows: int, mode: runtime.Mode = MODE) -> runtime.Resolution:
        return store.resolve(GATED_NORM_FWD, norm_dims(rows=rows), "bf16", mode)

    # Both SKUs have the key: each GPU runs its own entry.
    res = on(on_h100, 16384)
    assert res.config == CFG_H100 and not res.sibling and res.source.startswith("exact ")
    assert (res.tuned_on, res.running_on) == ("h100", "h100")
    assert on(on_h200, 16384).config == CFG_H200 and not on(on_h200, 16384).sibling
    # This SKU's nearest (rows 4096, 2x away) beats the sibling's exact (rows 8192).
    res = on(on_h100, 8192)
    assert res.config == CFG_H100_NEAR and res.source.startswith("nearest gated_norm_fwd|") and not res.sibling
    # Nothing of this SKU's within 4x: the sibling's exact, then its nearest, each said to be one.
    res = on(on_h100, 131072)
    assert res.config == CFG_H200_ONLY and res.sibling
    assert res.source == f"exact (tuned on h200, running on h100) {h200_file}"
    res = on(on_h100, 262144)
    assert res.config == CFG_H200_ONLY and res.source.startswith("nearest gated_norm_fwd|")
    assert "(tuned on h200, running on h100)" in res.source
    # Beyond every entry: default. Exact mode skips both nearest steps: the sibling's exact wins.
    assert on(on_h100, 1 << 22).config is None
    assert on(on_h100, 8192, runtime.Mode.exact).config == CFG_H200
    assert on(on_h100, 8192, runtime.Mode.exact).sibling
    # The H200 has no H100 fallback to take where its own entries serve.
    assert on(on_h200, 4096).config == CFG_H200 and not on(on_h200, 4096).sibling
    assert msgs == []


def test_sibling_skus_and_the_sku_rule() -> None:
    from mamba_tune.sku import siblings

    assert Gpu.of("NVIDIA H100 80GB HBM3", (9, 0)) == Gpu("NVIDIA H100 80GB HBM3", "9.0", "h100", "sm90")
    assert Gpu.of("NVIDIA GH200 480GB", (9, 0)).sku == "gh200" == sku_of("NVIDIA GH200 480GB")
    assert siblings("h100") == ["gh200", "h200"] and siblings("a100") == [] and siblings("rtx-9000") == []


@pytest.mark.parametrize("gpu", [A100, B200], ids=["a100-sm80", "b200-sm100"])
def test_gpu_with_no_bundle_runs_defaults_with_one_warning_text(tmp_path: Path, gpu: GpuInfo) -> None:
    paths, _ = _write_pair(tmp_path, "h100 first")
    msgs: list[str] = []
    store = runtime.ConfigStore(paths, running_on(gpu), msgs.append)
    for rows in (16384, 131072):
        assert store.resolve(GATED_NORM_FWD, norm_dims(rows=rows), "bf16", MODE).config is None
    warning = store.no_bundle_warning()
    assert warning is not None and "\n" not in warning
    assert f"this GPU, {gpu.name} ({gpu.sku}, {gpu.arch})" in warning
    assert "the bundles found are for h100 (sm90), h200 (sm90)" in warning
    assert "every kernel runs its default config" in warning
    assert f"`mamba-tune sweep sweeps/<spec>.yaml` with the spec's `target: {{gpu: {gpu.sku}}}`" in warning
    assert "GPU_SKUS" not in warning  # a known SKU: the spec accepts it as it is
    # A SKU with its own or a sibling's bundle gets no such warning.
    assert runtime.ConfigStore(paths, running_on(H100), msgs.append).no_bundle_warning() is None
    assert runtime.ConfigStore(paths[1:], running_on(H100), msgs.append).no_bundle_warning() is None
    assert msgs == []


def test_unknown_gpu_is_told_to_name_its_sku(tmp_path: Path) -> None:
    store = runtime.ConfigStore([tmp_path], Gpu.of("NVIDIA RTX PRO 6000 Blackwell", (12, 0)), pytest.fail)
    warning = store.no_bundle_warning()
    assert warning is not None and "no bundle found in" in warning
    assert "(first add rtx-pro-6000-blackwell to GPU_SKUS in mamba_tune/sku.py)" in warning


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """Make the runtime's device seam answer as this GPU (counting its calls); reset after."""
    reads: list[torch.device] = []

    def use(info: GpuInfo, paths: list[Path]) -> list[torch.device]:
        def read_gpu(device: torch.device) -> Gpu:
            reads.append(device)
            return running_on(info)

        monkeypatch.setattr(runtime, "read_gpu", read_gpu)
        runtime.configure(bundle_paths=paths)
        return reads

    yield use
    runtime.configure()


def _norm_args(rows: int) -> tuple[object, ...]:
    x = torch.randn(rows, 2, 32, dtype=torch.bfloat16)
    return (x, x, torch.ones(2, 32), None, 1e-6, False, True)


@pytest.mark.parametrize("order", ["h100 first", "h200 first"])
def test_runtime_resolves_through_the_device_seam_once(tmp_path: Path, fake_gpu, order: str) -> None:
    """runtime.resolve end to end: the faked device, read once, picks the store and its tier."""
    for info, cfg in ((H100, CFG_H100), (H200, CFG_H200)):
        b = bundle(entry(dims=norm_dims(rows=64, d=64, group_size=32), config=cfg), gpu=info)
        write_bundle(b, tmp_path / info.sku / "small.json")
    folders = [tmp_path / "h100", tmp_path / "h200"]
    reads = fake_gpu(H100, folders if order == "h100 first" else folders[::-1])
    for _ in range(3):
        res = runtime.resolve(GATED_NORM_FWD, _norm_args(64))
        assert res.config == CFG_H100 and not res.sibling and "h100/small.json" in res.source
    assert len(reads) == 1
    fake_gpu(H100, [tmp_path / "h200"])  # only the sibling's bundle
    res = runtime.resolve(GATED_NORM_FWD, _norm_args(64))
    assert res.config == CFG_H200 and res.source.startswith("exact (tuned on h200, running on h100) ")


def test_recorder_says_the_entry_was_tuned_on_a_sibling(tmp_path: Path, fake_gpu) -> None:
    """The record names the SKU the entry came from, and `sweep --from-record` tunes that key."""
    dims = norm_dims(rows=32, d=64, group_size=32, norm_before_gate=1)
    write_bundle(bundle(entry(dims=dims, config=CFG_H200), gpu=H200), tmp_path / "h200" / "b.json")
    fake_gpu(H100, [tmp_path])
    path = tmp_path / "rec.json"
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad(), mamba_tune.record_calls(path):
        for _ in range(2):
            mamba_tune.rmsnorm_fn(x, torch.ones(64), None, z=torch.randn_like(x), group_size=32)
    doc = json.loads(path.read_text())
    assert doc["devices"] == [H100.name]
    (rec,) = doc["calls"].values()
    assert rec["served"] == {"exact (tuned on h200, running on h100)": 2}
    plan = combos_from_record(path)
    assert plan.exact == 0 and [c.dims for c in plan.combos] == [dims] and plan.skus == ["h100"]


NORM = """
import logging, sys, warnings
import torch
from mamba_tune import runtime
from mamba_tune.norm.gated import GATED_NORM_FWD
from mamba_tune.sku import Gpu
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(levelname)s %(message)s")
runtime._check_device = lambda rk, args: None  # no GPU here: compile, never launch
def call(rows):
    x = torch.randn(rows, 2, 32, dtype=torch.bfloat16)
    return (x, x, torch.ones(2, 32), None, 1e-6, False, True)
"""


def test_gpus_without_their_own_bundle_in_compiled_mode(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """Compiled mode, as on a GPU (the CPU compiles but cannot launch). An A100 with only sm90
    bundles: every shape compiles with its default config and one warning names the A100 and
    the command. An H100 with only the H200's bundle: the H200 entry runs, logged as one."""
    dims = norm_dims(rows=64, d=64, group_size=32)
    write_bundle(bundle(entry(dims=dims, config=CFG_H200), gpu=H200), tmp_path / "h200" / "nano.json")
    code = NORM + f"""
runtime.read_gpu = lambda device: Gpu.of({A100.name!r}, (8, 0))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for rows in (64, 32, 16):
        assert callable(runtime.lookup(GATED_NORM_FWD, call(rows)))
for w in caught:
    print("W", w.category.__name__, w.message)
for source in runtime.resolutions().values():
    print("R", source)
runtime.read_gpu = lambda device: Gpu.of({H100.name!r}, (9, 0))
runtime.configure()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    runtime.lookup(GATED_NORM_FWD, call(64))
print("H100 warnings", len(caught))
"""
    r = subprocess.run([sys.executable, "-c", code], env={**clean_env, runtime.ENV_CONFIGS: str(tmp_path)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    warned = [line for line in lines if line.startswith("W ")]
    assert len(warned) == 1, r.stdout
    assert warned[0].startswith("W MambaTuneWarning mamba-tune: no tuned configs for this GPU, NVIDIA A100-SXM4-80GB "
                                "(a100, sm80): the bundles found are for h200 (sm90)"), warned
    assert "`mamba-tune sweep sweeps/<spec>.yaml` with the spec's `target: {gpu: a100}`" in warned[0]
    assert [line for line in lines if line.startswith("R ")] == ["R default"] * 3
    sibling = [line for line in lines if "(tuned on h200, running on h100)" in line]
    key = f"gated_norm_fwd|{','.join(f'{k}={dims[k]}' for k in sorted(dims))}|bf16"
    assert f"LOG INFO {key}: exact (tuned on h200, running on h100) {tmp_path}/h200/nano.json" in sibling, r.stdout
    said = [line for line in lines if line.startswith("LOG WARNING mamba-tune: this h100 runs configs tuned on h200")]
    assert len(said) == 1 and "`target: {gpu: h100}`" in said[0], r.stdout
    assert "H100 warnings 0" in lines
