"""`mamba_tune.patch_transformers`: what it replaces in transformers' Mamba-2 models, and that they
then compute what their own path computes.

transformers 5.15+ calls its Mamba-2 functions on any device (no CUDA gate), so on CPU the
patched models run mamba-tune's kernels in Helion's ref mode (conftest sets
HELION_INTERPRET) through their ordinary forward: the tiny models of hf_tiny.py, patched,
against the same weights unpatched (transformers' PyTorch code here, where mamba-ssm's
Triton kernels cannot run). A function mamba-tune does not have yet runs transformers' own
in both arms (with a warning); the comparison then checks the provided ones inside the
model. The tests read `not_provided()`, so they stay true as kernels are added.
GPU tests: tests/patch/test_transformers_patch_gpu.py.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import hf_tiny
import pytest
import torch

import mamba_tune
from mamba_tune import transformers_patch as tp
from mamba_tune.runtime import MambaTuneWarning

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
MODEL_TYPES = [f.model_type for f in tp.FAMILIES]
# transformers 5.0-5.14 (what tp calls legacy) has another structure; CI installs the newest.
LEGACY = tp._is_legacy(importlib.import_module("transformers").__version__)
NEW = pytest.mark.skipif(LEGACY, reason="transformers 5.15+'s module-level functions")
OLD = pytest.mark.skipif(not LEGACY, reason="needs transformers 5.0-5.14 (lazy_load_kernel in the mixers)")
ABSENT = object()


def _present(model_type: str) -> bool:
    return importlib.util.find_spec(f"transformers.models.{model_type}") is not None


@pytest.fixture
def modules() -> Iterator[dict[str, ModuleType]]:
    """Each family's modeling module (those this transformers has); never patched after the test."""
    tp.unpatch_transformers()
    yield {f.model_type: importlib.import_module(f.module) for f in tp.FAMILIES if _present(f.model_type)}
    tp.unpatch_transformers()


def _transformers() -> ModuleType:
    """The transformers module now in sys.modules (importing a model module replaces the first one)."""
    return importlib.import_module("transformers")


def _snapshot(mods: dict[str, ModuleType]) -> dict[tuple[Any, str], Any]:
    out: dict[tuple[Any, str], Any] = {}
    for model_type, module in mods.items():
        out.update({(module, name): vars(module).get(name, ABSENT) for name in tp._functions(LEGACY)})
        out.update({(cls, "forward"): vars(cls).get("forward") for cls in tp._norm_classes(module)})
        if LEGACY:
            mixer = getattr(module, next(f.mixer for f in tp.FAMILIES if f.model_type == model_type))
            out[(mixer, "__init__")] = vars(mixer).get("__init__")
    return out


def _same(a: dict[tuple[Any, str], Any], b: dict[tuple[Any, str], Any]) -> list[tuple[Any, str]]:
    return [k for k in a if a[k] is not b[k]]


# --- the switch ---------------------------------------------------------------------------


def test_patch_replaces_every_function_and_norm_and_unpatch_restores_the_same_objects(modules):
    before = _snapshot(modules)
    if not LEGACY:  # every function of every family, and the norm classes (5.15-5.20's NemotronH uses Zamba2's)
        assert len(before) >= 4 * len(tp.FUNCTIONS) + 3
    assert not mamba_tune.is_transformers_patched()
    mamba_tune.patch_transformers()
    assert mamba_tune.is_transformers_patched()
    after_patch = _snapshot(modules)
    for key, original in before.items():
        new = after_patch[key]
        assert new is not original, f"{key} not replaced"
        if hasattr(new, "mamba_tune_legacy_of"):  # legacy, not provided: reads transformers' lookup at call time
            continue
        assert new.mamba_tune_runs
        if callable(original):
            assert new.__wrapped__ is original, key
    mamba_tune.unpatch_transformers()
    assert not mamba_tune.is_transformers_patched()
    assert not _same(before, _snapshot(modules))


def test_patching_twice_and_unpatching_twice_are_no_ops(modules):
    before = _snapshot(modules)
    mamba_tune.unpatch_transformers()  # not patched: nothing happens
    assert not _same(before, _snapshot(modules))
    mamba_tune.patch_transformers()
    patched = _snapshot(modules)
    mamba_tune.patch_transformers(strict=True)  # only strict changes
    assert not _same(patched, _snapshot(modules)) and tp._STATE.strict
    mamba_tune.unpatch_transformers()
    mamba_tune.unpatch_transformers()
    assert not _same(before, _snapshot(modules)) and not tp._STATE.strict


def test_unpatch_leaves_a_name_someone_else_replaced_after_the_patch(modules):
    module = modules["mamba2"]
    name = "mamba_chunk_scan_combined" if LEGACY else "mamba2_chunk_scan"
    original = vars(module).get(name, ABSENT)
    mamba_tune.patch_transformers()
    mine = object()
    setattr(module, name, mine)
    try:
        mamba_tune.unpatch_transformers()
        assert getattr(module, name) is mine
        rest = vars(module).get("causal_conv1d_fn")  # the rest is restored
        assert not hasattr(rest, "mamba_tune_runs") and not hasattr(rest, "mamba_tune_legacy_of")
    finally:  # later tests build real models
        if original is ABSENT:
            delattr(module, name)
        else:
            setattr(module, name, original)


def test_context_manager_restores_the_state_before_it(modules):
    before = _snapshot(modules)
    with mamba_tune.patched_transformers():
        assert mamba_tune.is_transformers_patched()
    assert not mamba_tune.is_transformers_patched() and not _same(before, _snapshot(modules))
    mamba_tune.patch_transformers()
    with mamba_tune.patched_transformers(strict=True):
        assert tp._STATE.strict
    assert mamba_tune.is_transformers_patched() and not tp._STATE.strict  # patched before: still after
    with pytest.raises(RuntimeError, match="boom"), mamba_tune.patched_transformers():
        raise RuntimeError("boom")
    assert mamba_tune.is_transformers_patched()


def test_transformers_absent_raises_an_import_error_naming_it(modules, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` then fails on
    with pytest.raises(mamba_tune.TransformersNotInstalledError, match="transformers is not installed"):
        mamba_tune.patch_transformers()
    assert issubclass(mamba_tune.TransformersNotInstalledError, ImportError)
    assert not mamba_tune.is_transformers_patched()


def test_transformers_4_is_refused(modules, monkeypatch):
    monkeypatch.setattr(_transformers(), "__version__", "4.57.1")
    with pytest.raises(mamba_tune.UnsupportedTransformersError, match=r"4\.57\.1 is not supported .*>= 5\.0\.0"):
        mamba_tune.patch_transformers()
    assert not mamba_tune.is_transformers_patched()


@NEW
def test_a_newer_transformers_is_patched_with_a_warning_when_its_modules_match(modules, monkeypatch):
    monkeypatch.setattr(_transformers(), "__version__", "5.99.0")
    with pytest.warns(MambaTuneWarning, match=r"5\.99\.0 is newer than the tested"):
        mamba_tune.patch_transformers()
    assert mamba_tune.is_transformers_patched()


@NEW
def test_a_newer_transformers_whose_modules_changed_is_refused_and_nothing_patched(modules, monkeypatch):
    monkeypatch.setattr(_transformers(), "__version__", "5.99.0")
    before = _snapshot(modules)
    monkeypatch.delattr(modules["zamba2"], "mamba2_chunk_scan")
    with pytest.raises(mamba_tune.UnsupportedTransformersError, match=r"modeling_zamba2 has no mamba2_chunk_scan"):
        mamba_tune.patch_transformers()
    assert not mamba_tune.is_transformers_patched()
    assert all(v is before[k] for k, v in _snapshot({"mamba2": modules["mamba2"]}).items())


@pytest.mark.slow
@pytest.mark.parametrize(("value", "patched", "strict"), [("1", True, False), ("strict", True, True), ("0", False, False)])
def test_the_environment_variable_patches_at_import(clean_env, value, patched, strict):
    env = {**clean_env, tp.ENV_PATCH: value}
    code = "import mamba_tune; from mamba_tune import transformers_patch as t; print(t.is_transformers_patched(), t._STATE.strict)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(patched), str(strict)]


@pytest.mark.slow
def test_a_bad_environment_value_fails_at_import_saying_what_it_expects(clean_env):
    env = {**clean_env, tp.ENV_PATCH: "yes"}
    r = subprocess.run([sys.executable, "-c", "import mamba_tune"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "MAMBA_TUNE_PATCH_TRANSFORMERS='yes'; expected 0, 1 or strict" in r.stderr


# --- one function at a time, against transformers' PyTorch code -----------------------------

# The mixers' sizes: batch, seqlen, heads, headdim, groups, dstate, conv width.
b, L, h, p, g, n, w = 2, 40, 4, 16, 2, 16, 4
D_CONV = h * p + 2 * g * n


def _inputs(tf_name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments as the mixers pass them (layouts included: conv input channels-last)."""
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    A = -(torch.rand(h, generator=gen) + 0.5)
    if tf_name == "mamba2_chunk_scan":
        return ((r(b, L, h, p), r(b, L, h), A, r(b, L, g, n), r(b, L, g, n)),
                {"chunk_size": 16, "D": r(h), "z": None, "return_final_states": True, "dt_bias": r(h, scale=0.5),
                 "dt_softplus": True, "initial_states": r(b, h, p, n), "dt_limit": (0.0, float("inf"))})
    if tf_name == "causal_conv1d_fn":  # (b, d, l) as a transpose of the in_proj slice
        return (r(b, L, D_CONV).transpose(1, 2), r(D_CONV, w, scale=0.5), r(D_CONV)), {"activation": "silu"}
    if tf_name == "causal_conv1d_update":  # one token; conv_state (b, d, w) updated in place
        return (r(b, 1, D_CONV).transpose(1, 2), r(b, D_CONV, w), r(D_CONV, w, scale=0.5), r(D_CONV)), \
            {"activation": "silu"}
    if tf_name == "mamba2_selective_state_update":  # state (b, h, p, n) updated in place
        return ((r(b, h, p, n), r(b, h, p), r(b, h)[..., None].expand(b, h, p), A[:, None, None].expand(h, p, n),
                 r(b, g, n), r(b, g, n), r(h)[:, None].expand(h, p)),
                {"z": None, "dt_bias": r(h, scale=0.5)[:, None].expand(h, p), "dt_softplus": True})
    assert tf_name == "mamba2_split_conv1d_scan_combined"
    return ((r(b, L, 2 * h * p + 2 * g * n + h), r(D_CONV, w, scale=0.5), r(D_CONV), r(h, scale=0.5), A),
            {"D": r(h), "chunk_size": 16, "activation": "silu", "rmsnorm_weight": r(h * p), "rmsnorm_eps": 1e-5,
             "outproj_weight": r(32, h * p, scale=0.1), "outproj_bias": None, "headdim": p, "ngroups": g,
             "norm_before_gate": False, "return_final_states": False, "dt_limit": (0.0, float("inf"))})


def _run(function: Any, tf_name: str) -> list[Any]:
    """The function's outputs, then the tensors it updates in place."""
    args, kwargs = _inputs(tf_name)
    out = function(*args, **kwargs)
    outs = list(out) if isinstance(out, tuple) else [out]
    if tf_name == "causal_conv1d_update":
        outs.append(args[1])
    if tf_name == "mamba2_selective_state_update":
        outs.append(args[0])
    return outs


@NEW
@pytest.mark.parametrize("tf_name", list(tp.FUNCTIONS))
def test_each_function_runs_mamba_tunes_or_says_it_has_none(modules, tf_name):
    name = tp.FUNCTIONS[tf_name]
    module = modules["mamba2"]
    original = getattr(module, tf_name)
    mamba_tune.patch_transformers()
    patched = getattr(module, tf_name)
    ours = tp.provided(name)
    if ours is not None:
        assert ours is getattr(mamba_tune, name) and patched.mamba_tune_runs == f"mamba_tune.{name}"
        if tf_name == "mamba2_split_conv1d_scan_combined":
            pytest.skip("transformers has no PyTorch fused function (its stand-in returns None): "
                        "test_training_step_matches_the_models_own_path compares the mixer")
        torch_function = tp._inner(original).__wrapped__  # the decorated PyTorch function
        for got, want in zip(_run(patched, tf_name), _run(torch_function, tf_name), strict=True):
            torch.testing.assert_close(got.float(), want.float(), atol=2e-4, rtol=2e-4)
        return
    # Not provided: strict raises naming it; otherwise one warning, then transformers' own runs.
    assert name in tp.not_provided()
    mamba_tune.patch_transformers(strict=True)
    with pytest.raises(NotImplementedError, match=rf"mamba-tune has no {name} yet .*strict=True"):
        _run(patched, tf_name)
    mamba_tune.patch_transformers(strict=False)
    with pytest.warns(MambaTuneWarning, match=rf"mamba-tune has no {name} yet .*this runs"):
        got = _run(patched, tf_name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MambaTuneWarning)  # warned once: an error if it warned again
        again = _run(patched, tf_name)
    want = _run(original, tf_name)
    for x, y, z in zip(got, again, want, strict=True):
        if z is None:  # the fused stand-in: the mixer takes its unfused path
            assert x is None and y is None
        else:
            assert torch.equal(x, z) and torch.equal(y, z)


def _norm_cases() -> list[Any]:
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1RMSNormGated
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated

    cases = []
    grouped = {"group_size": 32} if "group_size" in inspect.signature(MambaRMSNormGated).parameters else {}
    cases.append(pytest.param(MambaRMSNormGated, grouped, True, id=f"mamba2-{'grouped' if grouped else 'row'}"))
    cases.append(pytest.param(MambaRMSNormGated, grouped, False, id="mamba2-no-gate"))
    for n_groups in (1, 2):
        for before in (False, True):
            cases.append(pytest.param(FalconH1RMSNormGated, {"n_groups": n_groups, "norm_before_gate": before}, True,
                                      id=f"falcon_h1-groups{n_groups}-{'norm-gate' if before else 'gate-norm'}"))
    return cases


@pytest.mark.parametrize(("cls", "kwargs", "gated"), _norm_cases())
def test_the_gated_norm_matches_the_modules_own_forward(modules, cls, kwargs, gated):
    gen = torch.Generator().manual_seed(1)
    norm = cls(64, eps=1e-5, **kwargs)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=gen))
    x, z = torch.randn(2, 5, 64, generator=gen), torch.randn(2, 5, 64, generator=gen)
    x.requires_grad_(True)
    args = (x, z) if gated else (x,)
    want = norm(*args)
    (dx_want,) = torch.autograd.grad(want.square().sum(), x)
    with mamba_tune.patched_transformers():
        assert type(norm).forward.mamba_tune_runs == "mamba_tune.rmsnorm_fn"
        got = norm(*args)
        (dx_got,) = torch.autograd.grad(got.square().sum(), x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx_got, dx_want, atol=1e-4, rtol=1e-4)


# --- tiny models ------------------------------------------------------------------------------


def _expected_calls() -> dict[str, str | None]:
    """What a patched mixer runs: mamba-tune's function, or None where transformers' own runs."""
    out: dict[str, str | None] = {tf: f"mamba_tune.{name}" if tp.provided(name) else None
                                  for tf, name in tp.FUNCTIONS.items()}
    out["norm"] = "mamba_tune.rmsnorm_fn"
    return out


@NEW
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_tiny_models_built_patched_call_mamba_tunes_functions(modules, model_type):
    family = next(f for f in tp.FAMILIES if f.model_type == model_type)
    unpatched = tp.mixer_functions(hf_tiny.MODELS[model_type]())
    assert set(unpatched) == {family.mixer}
    assert all(v.startswith("transformers: ") for v in unpatched[family.mixer].values()), unpatched
    with mamba_tune.patched_transformers():
        calls = tp.mixer_functions(hf_tiny.MODELS[model_type]())[family.mixer]
    for function, expected in _expected_calls().items():
        if expected is not None:
            assert calls[function] == expected, (function, calls)
        elif function == "mamba2_split_conv1d_scan_combined":
            assert calls[function].startswith("the mixer's unfused path"), calls
        else:
            assert calls[function].startswith(f"transformers' {function} ("), calls


def _kernels_run(record: Path) -> set[str]:
    return {call["kernel"] for call in json.loads(record.read_text())["calls"].values()}


def _quiet_forward(model: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, set[str]]:
    """model(...) and the mamba-tune functions it warned about (each must be one not provided)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MambaTuneWarning)
        out = model(*args, **kwargs)
    named = {str(w.message).split()[3] for w in caught if issubclass(w.category, MambaTuneWarning)}
    assert named <= set(tp.not_provided()), named
    return out, named


@NEW
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_forward_matches_the_models_own_path(modules, model_type, tmp_path):
    torch.manual_seed(0)
    model = hf_tiny.MODELS[model_type]().eval()
    ids = hf_tiny.tokens()
    with torch.no_grad():
        with hf_tiny.own_pytorch_path(modules):
            want = model(ids).logits
        with mamba_tune.patched_transformers(), mamba_tune.record_calls(tmp_path / "calls.json"):
            got, _ = _quiet_forward(model, ids)
    torch.testing.assert_close(got.logits, want, atol=1e-4, rtol=1e-4)
    ran = _kernels_run(tmp_path / "calls.json")
    assert {"gated_norm_fwd", "ssd_chunk_cumsum", "ssd_chunk_scan"} <= ran, ran


@NEW
@pytest.mark.parametrize("model_type", ["mamba2", "nemotron_h"])
def test_cached_generation_matches_the_models_own_path(modules, model_type, tmp_path):
    torch.manual_seed(0)
    model = hf_tiny.MODELS[model_type]().eval()
    ids = hf_tiny.tokens(seqlen=24)
    kwargs = {"max_new_tokens": 4, "do_sample": False, "return_dict_in_generate": True, "output_logits": True}
    with hf_tiny.own_pytorch_path(modules):
        want = model.generate(ids, **kwargs)
    with mamba_tune.patched_transformers(), mamba_tune.record_calls(tmp_path / "calls.json"):
        got, _ = _quiet_forward(model.generate, ids, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for step, (x, y) in enumerate(zip(got.logits, want.logits, strict=True)):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")
    # The prefill returned its final states to the cache; the decoding steps' norm is ours.
    rows = {c["dims"].get("rows") for c in json.loads((tmp_path / "calls.json").read_text())["calls"].values()
            if c["kernel"] == "gated_norm_fwd"}
    assert 2 in rows, rows  # batch 2 x one token


@NEW
@pytest.mark.parametrize("model_type", ["mamba2", "nemotron_h"])
def test_training_step_matches_the_models_own_path(modules, model_type, tmp_path):
    """train(): the fused call first (ours, or None: the unfused path), then loss and every gradient."""
    torch.manual_seed(0)
    theirs = hf_tiny.MODELS[model_type]().train()
    ours = copy.deepcopy(theirs)
    ids = hf_tiny.tokens()
    with hf_tiny.own_pytorch_path(modules):
        want = theirs(ids, labels=ids)
        want.loss.backward()
    with mamba_tune.patched_transformers(), mamba_tune.record_calls(tmp_path / "calls.json"):
        got, _ = _quiet_forward(ours, ids, labels=ids)
        got.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)
    for (name, a), (_, b_) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        if b_.grad is None:
            assert a.grad is None, name
            continue
        torch.testing.assert_close(a.grad, b_.grad, atol=1e-5, rtol=1e-4, msg=lambda m, k=name: f"{k}: {m}")
    ran = _kernels_run(tmp_path / "calls.json")
    assert {"gated_norm_bwd", "ssd_chunk_cumsum_bwd", "ssd_chunk_scan_chunk_state_bwd_dx"} <= ran, ran


@NEW
def test_strict_mode_stops_a_training_forward_at_a_function_not_provided(modules):
    missing = tp.not_provided()
    if not missing:
        pytest.skip("mamba-tune provides every function the mixers call")
    model = hf_tiny.mamba2().train()
    with mamba_tune.patched_transformers(strict=True), \
            pytest.raises(NotImplementedError, match=rf"mamba-tune has no ({'|'.join(missing)}) yet"):
        model(hf_tiny.tokens())


# --- transformers 5.0-5.14 (run by hand with those versions; CI installs the newest) -----------


def _causal_conv1d_stand_in(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            seq_idx: torch.Tensor | None = None, activation: str | None = None) -> torch.Tensor:
    """causal-conv1d's causal_conv1d_fn in PyTorch: that package (CUDA only) cannot be installed here,
    and without it these versions' kernel path cannot run at all."""
    out = torch.nn.functional.conv1d(x, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1,
                                     groups=x.shape[1])[..., : x.shape[-1]]
    return torch.nn.functional.silu(out) if activation in ("silu", "swish") else out


@pytest.fixture
def conv_stand_in(modules, monkeypatch) -> None:
    """Each mixer's __init__ finds the stand-in as if causal-conv1d were installed (lazy_load_kernel)."""
    found = types.SimpleNamespace(causal_conv1d_fn=_causal_conv1d_stand_in, causal_conv1d_update=None)
    for model_type in ("mamba2", "nemotron_h"):
        module = modules.get(model_type)
        if module is not None and hasattr(module, "lazy_load_kernel"):
            lookup = module.lazy_load_kernel
            monkeypatch.setattr(module, "lazy_load_kernel",
                                lambda name, lookup=lookup: found if name == "causal-conv1d" else lookup(name))


@OLD
@pytest.mark.parametrize("model_type", ["mamba2", "nemotron_h"])
def test_legacy_kernel_path_on_cpu_matches_torch_forward(modules, conv_stand_in, model_type, tmp_path):
    """The mixers take cuda_kernels_forward only on CUDA: called directly here, on CPU tensors in
    ref mode, against the same mixer's torch_forward (forward and gradients)."""
    if not _present(model_type):
        pytest.skip(f"this transformers has no {model_type}")
    family = next(f for f in tp.FAMILIES if f.model_type == model_type)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MambaTuneWarning)  # the kernel path lacks the decoding functions here
        with mamba_tune.patched_transformers():
            model = hf_tiny.MODELS[model_type]().eval()
            calls = tp.mixer_functions(model)[family.mixer]
            mixer = next(m for m in model.modules() if type(m).__name__ == family.mixer)
            x = torch.randn(2, hf_tiny.SEQLEN, 32, requires_grad=True)
            with mamba_tune.record_calls(tmp_path / "calls.json"):
                got = mixer.cuda_kernels_forward(x)
                (dx_got,) = torch.autograd.grad(got.square().sum(), x)
    assert calls["mamba_chunk_scan_combined"] == "mamba_tune.mamba_chunk_scan_combined"
    assert calls["norm"] == "mamba_tune.rmsnorm_fn"
    want = mixer.torch_forward(x)
    (dx_want,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx_got, dx_want, atol=1e-4, rtol=1e-4)
    assert {"gated_norm_bwd", "ssd_chunk_scan", "ssd_chunk_cumsum_bwd"} <= _kernels_run(tmp_path / "calls.json")


@OLD
def test_legacy_mixer_init_keeps_the_patch_and_unpatch_puts_back_transformers_lookup(modules, conv_stand_in):
    module = modules["mamba2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MambaTuneWarning)
        mamba_tune.patch_transformers()
        hf_tiny.mamba2()  # its __init__ assigns the module's globals from lazy_load_kernel
    assert module.mamba_chunk_scan_combined.mamba_tune_runs == "mamba_tune.mamba_chunk_scan_combined"
    assert module.causal_conv1d_fn.mamba_tune_legacy_of is module
    mamba_tune.unpatch_transformers()
    assert module.causal_conv1d_fn is _causal_conv1d_stand_in  # what transformers' lookup found
    assert not hasattr(module.mamba_chunk_scan_combined, "mamba_tune_runs")
    assert "__init__" not in vars(module.Mamba2Mixer) or not hasattr(module.Mamba2Mixer.__init__, "mamba_tune_runs")


@OLD
def test_legacy_kernel_path_that_cannot_run_warns_and_strict_raises(modules):
    """Here (CPU) transformers finds neither mamba-ssm's kernels nor causal-conv1d."""
    lacking = [n for n in tp.LEGACY_FUNCTIONS if tp.provided(n) is None]
    if not lacking:
        pytest.skip("mamba-tune provides every function")
    with pytest.warns(MambaTuneWarning, match=r"modeling_mamba2: the mixers' kernel path .* needs .*torch_forward"):
        mamba_tune.patch_transformers()
        model = hf_tiny.mamba2()
    assert tp.mixer_functions(model)["Mamba2Mixer"]["path"].startswith("torch_forward")
    mamba_tune.unpatch_transformers()
    # Strict: the patch itself refuses (the globals are known since a mixer was built), or the next mixer's
    # __init__ does; either way nothing stays patched.
    with pytest.raises(NotImplementedError, match=r"kernel path .*\(strict=True\) refuses"), \
            mamba_tune.patched_transformers(strict=True):
        hf_tiny.mamba2()
    assert not mamba_tune.is_transformers_patched()
