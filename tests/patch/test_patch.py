"""`mamba_tune.patch_mamba_ssm`: what it replaces in mamba-ssm's modules, and that it restores exactly.

mamba-ssm 2.3.2.post1's pure-Python modules are imported for real (CI installs them
without the CUDA extensions; see mamba_ssm_cpu.py); where mamba-ssm is not installed, only
the tests that need no mamba-ssm run. The module forward on the patched kernels is
tests/ssd/test_patch_module.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import mamba_ssm_cpu
import pytest
import torch

import mamba_tune
from mamba_tune import patch
from mamba_tune.runtime import MambaTuneWarning

ROOT = Path(__file__).resolve().parents[2]
NEEDS_MAMBA_SSM = pytest.mark.skipif(not mamba_ssm_cpu.installed(),
                                     reason="mamba-ssm is not installed (.ci/run installs it)")

SSD = "mamba_ssm.ops.triton.ssd_combined"
NORM = "mamba_ssm.ops.triton.layernorm_gated"
MAMBA2 = "mamba_ssm.modules.mamba2"
SIMPLE = "mamba_ssm.modules.mamba2_simple"
STATE_UPDATE = "mamba_ssm.ops.triton.selective_state_update"
# (module, attribute) -> what the patch must put there.
EXPECTED = {
    (NORM, "rmsnorm_fn"): mamba_tune.rmsnorm_fn,
    (NORM, "layernorm_fn"): mamba_tune.layernorm_fn,
    (NORM, "RMSNorm"): mamba_tune.RMSNormGated,
    (NORM, "LayerNorm"): mamba_tune.LayerNormGated,
    (SSD, "mamba_chunk_scan_combined"): mamba_tune.mamba_chunk_scan_combined,
    (SSD, "rmsnorm_fn"): mamba_tune.rmsnorm_fn,
    (MAMBA2, "mamba_chunk_scan_combined"): mamba_tune.mamba_chunk_scan_combined,
    (MAMBA2, "RMSNormGated"): mamba_tune.RMSNormGated,
    (SIMPLE, "mamba_chunk_scan_combined"): mamba_tune.mamba_chunk_scan_combined,
    (SIMPLE, "RMSNormGated"): mamba_tune.RMSNormGated,
    (SIMPLE, "LayerNorm"): mamba_tune.LayerNormGated,
    ("mamba_ssm.modules.mamba3", "RMSNormGated"): mamba_tune.RMSNormGated,
    ("mamba_ssm.modules.ssd_minimal", "mamba_chunk_scan_combined"): mamba_tune.mamba_chunk_scan_combined,
    (STATE_UPDATE, "selective_state_update"): mamba_tune.selective_state_update,
    (MAMBA2, "selective_state_update"): mamba_tune.selective_state_update,
    (SSD, "mamba_split_conv1d_scan_combined"): mamba_tune.mamba_split_conv1d_scan_combined,
    (MAMBA2, "mamba_split_conv1d_scan_combined"): mamba_tune.mamba_split_conv1d_scan_combined,
    (SIMPLE, "mamba_split_conv1d_scan_combined"): mamba_tune.mamba_split_conv1d_scan_combined,
}
# Every function mamba-ssm 2.3.2.post1's Mamba-2 modules call has a kernel, so patch.NOT_PROVIDED
# is empty. Its path (a shim that warns once and runs mamba-ssm's own; strict raises) is tested
# on a real mamba-ssm function that no module calls, listed for each test by `_not_provided`.
STAND_IN = (SSD, "mamba_chunk_scan")
NOT_PROVIDED = [STAND_IN]


@pytest.fixture(autouse=True)
def _not_provided(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(patch.NOT_PROVIDED, STAND_IN, "a test's stand-in, called by no module")


@pytest.fixture
def mamba_ssm() -> Iterator[dict[str, ModuleType]]:
    """mamba-ssm's modules that the patch touches; never patched after the test."""
    if not mamba_ssm_cpu.installed():
        pytest.skip("mamba-ssm is not installed (.ci/run installs it)")
    mamba_ssm_cpu.load()
    import importlib

    names = {mod for mod, _ in [*EXPECTED, *NOT_PROVIDED]}
    mamba_tune.unpatch_mamba_ssm()
    yield {name: importlib.import_module(name) for name in names}
    mamba_tune.unpatch_mamba_ssm()


def _snapshot(mods: dict[str, ModuleType]) -> dict[tuple[str, str], object]:
    return {(m, a): getattr(mods[m], a) for m, a in [*EXPECTED, *NOT_PROVIDED]}


def test_patch_replaces_every_name_and_unpatch_restores_the_same_objects(mamba_ssm):
    before = _snapshot(mamba_ssm)
    assert not mamba_tune.is_patched()
    mamba_tune.patch_mamba_ssm()
    assert mamba_tune.is_patched()
    for (mod, attr), ours in EXPECTED.items():
        assert getattr(mamba_ssm[mod], attr) is ours, f"{mod}.{attr} not replaced"
    for mod, attr in NOT_PROVIDED:
        shim = getattr(mamba_ssm[mod], attr)
        assert shim is not before[(mod, attr)] and shim.__wrapped__ is before[(mod, attr)]
    mamba_tune.unpatch_mamba_ssm()
    assert not mamba_tune.is_patched()
    after = _snapshot(mamba_ssm)
    assert all(after[k] is before[k] for k in before), [k for k in before if after[k] is not before[k]]


def test_patching_twice_and_unpatching_twice_are_no_ops(mamba_ssm):
    before = _snapshot(mamba_ssm)
    mamba_tune.unpatch_mamba_ssm()  # not patched: nothing happens
    assert _snapshot(mamba_ssm) == before
    mamba_tune.patch_mamba_ssm()
    patched = _snapshot(mamba_ssm)
    mamba_tune.patch_mamba_ssm()
    again = _snapshot(mamba_ssm)
    assert all(again[k] is patched[k] for k in patched)
    mamba_tune.unpatch_mamba_ssm()
    mamba_tune.unpatch_mamba_ssm()
    after = _snapshot(mamba_ssm)
    assert all(after[k] is before[k] for k in before)


def test_unpatch_leaves_a_name_someone_else_replaced_after_the_patch(mamba_ssm):
    original = mamba_ssm[MAMBA2].RMSNormGated
    mamba_tune.patch_mamba_ssm()
    mine = object()
    mamba_ssm[MAMBA2].RMSNormGated = mine
    try:
        mamba_tune.unpatch_mamba_ssm()
        assert mamba_ssm[MAMBA2].RMSNormGated is mine
        assert mamba_ssm[MAMBA2].mamba_chunk_scan_combined is not mamba_tune.mamba_chunk_scan_combined
    finally:
        # The stand-in must not outlive this test: later tests build real Mamba2 modules.
        mamba_ssm[MAMBA2].RMSNormGated = original


def test_context_manager_restores_the_state_before_it(mamba_ssm):
    before = _snapshot(mamba_ssm)
    with mamba_tune.patched_mamba_ssm():
        assert mamba_ssm[MAMBA2].mamba_chunk_scan_combined is mamba_tune.mamba_chunk_scan_combined
    assert not mamba_tune.is_patched()
    assert all(_snapshot(mamba_ssm)[k] is before[k] for k in before)
    mamba_tune.patch_mamba_ssm()
    with mamba_tune.patched_mamba_ssm(strict=True):
        assert patch._STATE.strict
    assert mamba_tune.is_patched() and not patch._STATE.strict  # patched before: still patched after
    with pytest.raises(RuntimeError, match="boom"), mamba_tune.patched_mamba_ssm():
        raise RuntimeError("boom")
    assert mamba_tune.is_patched()


def test_not_provided_functions_warn_once_and_run_mamba_ssms_own(mamba_ssm):
    mamba_tune.patch_mamba_ssm()
    shim = mamba_ssm[SSD].mamba_chunk_scan
    # Called without arguments, mamba-ssm's own function raises TypeError: proof it ran.
    with pytest.warns(MambaTuneWarning, match=r"no kernel for mamba_chunk_scan yet .*stand-in"), \
            pytest.raises(TypeError):
        shim()
    with pytest.raises(TypeError):  # warned once: an error here if it warned again
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error", MambaTuneWarning)
            shim()


def test_the_fused_layer_is_ours_and_warns_nothing(mamba_ssm):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", MambaTuneWarning)
        mamba_tune.patch_mamba_ssm(strict=True)
        for mod in (SSD, MAMBA2, SIMPLE):
            fn = mamba_ssm[mod].mamba_split_conv1d_scan_combined
            assert fn is mamba_tune.mamba_split_conv1d_scan_combined and not hasattr(fn, "__wrapped__")
            with pytest.raises(ValueError, match="mamba_split_conv1d_scan_combined: zxbcdt must be"):
                fn(torch.zeros(4), torch.zeros(8, 4), None, torch.zeros(2), torch.zeros(2), torch.zeros(2), 16,
                   headdim=2)


def test_strict_refuses_what_is_not_provided(mamba_ssm):
    mamba_tune.patch_mamba_ssm(strict=True)
    for mod, attr in NOT_PROVIDED:
        with pytest.raises(NotImplementedError, match=f"no kernel for {attr} yet.*strict=True"):
            getattr(mamba_ssm[mod], attr)(None)
    # The decoding step is provided: strict runs ours (whose shape check answers a bad call).
    with pytest.raises(ValueError, match="selective_state_update: state must be"):
        mamba_ssm[MAMBA2].selective_state_update(*[torch.zeros(2)] * 6)


def test_mamba1_step_gets_the_decoding_step_where_its_module_imports(mamba_ssm):
    import importlib

    # On the CPU its module imports only with Mamba-1's CUDA extension stubbed (it is not called
    # here), and is gone again afterwards: the test runs the same whatever ran before it.
    with mamba_ssm_cpu.mamba1_importable():
        simple = importlib.import_module("mamba_ssm.modules.mamba_simple")
        before = simple.selective_state_update
        mamba_tune.patch_mamba_ssm()
        assert simple.selective_state_update is mamba_tune.selective_state_update
        mamba_tune.unpatch_mamba_ssm()
        assert simple.selective_state_update is before


@pytest.mark.parametrize("package", [False, True], ids=["causal-conv1d-absent", "causal-conv1d-installed"])
def test_conv1d_gaps_are_filled_only_where_causal_conv1d_is_absent(mamba_ssm, monkeypatch, package):
    # Without the package, mamba2's causal_conv1d_fn / causal_conv1d_update are None (torch fallback):
    # the patch fills them with ours and unpatch puts None back. With it (a stand-in function here),
    # they stay the package's.
    mod = mamba_ssm[MAMBA2]
    names = ("causal_conv1d_fn", "causal_conv1d_update")
    if package:
        for name in names:
            monkeypatch.setattr(mod, name, lambda *a, **k: None)
    before = {name: getattr(mod, name) for name in names}
    assert all((v is None) != package for v in before.values())
    with mamba_tune.patched_mamba_ssm():
        got = {name: getattr(mod, name) for name in names}
    if package:
        assert got == before
    else:
        assert got == {"causal_conv1d_fn": mamba_tune.causal_conv1d_fn,
                       "causal_conv1d_update": mamba_tune.causal_conv1d_update}
    assert {name: getattr(mod, name) for name in names} == before


def test_a_norm_built_before_the_patch_runs_the_kernels(mamba_ssm):
    norm = mamba_ssm[NORM].RMSNorm(32, eps=1e-5, group_size=16, norm_before_gate=False)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x, z = torch.randn(3, 5, 32), torch.randn(3, 5, 32)
    mamba_tune.patch_mamba_ssm()
    out = norm(x, z)  # mamba-ssm's class, whose forward calls layernorm_gated.rmsnorm_fn: ours
    expected = mamba_tune.rmsnorm_fn(x, norm.weight, None, z=z, eps=1e-5, group_size=16, norm_before_gate=False)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    built = mamba_ssm[MAMBA2].Mamba2(64, d_state=16, headdim=16, ngroups=2, chunk_size=16, use_mem_eff_path=False)
    assert type(built.norm) is mamba_tune.RMSNormGated  # built while patched
    assert built.norm.group_size == 64  # d_ssm 128 / ngroups 2


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full = {**os.environ, **env}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), *filter(None, [full.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
@NEEDS_MAMBA_SSM
def test_environment_variable_patches_at_import():
    code = ("import mamba_ssm_cpu; mamba_ssm_cpu.load()\n"
            "import mamba_tune\n"
            "from mamba_ssm.modules import mamba2\n"
            "print(mamba_tune.is_patched(), mamba2.mamba_chunk_scan_combined is mamba_tune.mamba_chunk_scan_combined)")
    r = _run(code, MAMBA_TUNE_PATCH_MAMBA_SSM="1")
    assert r.stdout.split() == ["True", "True"], r.stderr[-2000:]


@pytest.mark.parametrize("value,patched,strict", [("1", True, False), ("strict", True, True), ("STRICT ", True, True),
                                                  ("0", False, False), ("", False, False)])
def test_environment_variable_values(mamba_ssm, monkeypatch, value, patched, strict):
    monkeypatch.setenv(patch.ENV_PATCH, value)
    patch.patch_from_env()
    assert mamba_tune.is_patched() is patched and patch._STATE.strict is strict


def test_environment_variable_bad_value(monkeypatch):
    monkeypatch.setenv(patch.ENV_PATCH, "yes")
    with pytest.raises(ValueError, match="MAMBA_TUNE_PATCH_MAMBA_SSM='yes'; expected 0, 1 or strict"):
        patch.patch_from_env()
    assert not mamba_tune.is_patched()


def test_without_mamba_ssm_patching_raises_an_import_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # what `import mamba_ssm` then finds: nothing
    with pytest.raises(ImportError, match=r"^patch_mamba_ssm: the mamba-ssm package is not installed "
                                          r"\(pip install mamba-ssm==2.3.2.post1\)$") as info:
        mamba_tune.patch_mamba_ssm()
    assert isinstance(info.value, mamba_tune.MambaSsmNotInstalledError)
    assert not mamba_tune.is_patched()


@pytest.mark.slow
def test_without_mamba_ssm_the_environment_variable_fails_the_import():
    r = _run("import sys; sys.modules['mamba_ssm'] = None\nimport mamba_tune", MAMBA_TUNE_PATCH_MAMBA_SSM="1")
    assert r.returncode != 0
    assert "MambaSsmNotInstalledError: patch_mamba_ssm: the mamba-ssm package is not installed" in r.stderr


@pytest.mark.slow
@NEEDS_MAMBA_SSM
def test_mamba_ssm_whose_package_does_not_import_gets_the_cause():
    r = _run("try:\n    import mamba_ssm\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('IMPORTS')\n"
             "import mamba_tune; mamba_tune.patch_mamba_ssm()")
    if "IMPORTS" in r.stderr:
        pytest.skip("mamba-ssm's package imports here (its CUDA extensions are built)")
    assert r.returncode != 0
    # (Which module reports it depends on what the probe's failed import left loaded.)
    assert re.search(r"MambaSsmNotInstalledError: patch_mamba_ssm: mamba-ssm is installed but mamba_ssm\.[\w.]+ "
                     r"does not import: No module named 'selective_scan_cuda'", r.stderr), r.stderr[-2000:]
