"""A bundle's config values are data, never code: each is checked before Helion sees it
(Helion pastes some of them into the host code it runs), by every reader of a bundle
(load, validate, merge, diff, the run-time loader); and a config that cannot compile never
stops a training call (one warning, the kernel's default config from then on)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import bundle, entry, norm_dims
from pydantic import ValidationError
from typer.testing import CliRunner

from autotune_cli.app import app
from mamba_tune import runtime
from mamba_tune.bundle import BundleError, find_bundles, load_bundle, write_bundle
from mamba_tune.config_schema import schema_problem
from mamba_tune.norm.gated import GATED_NORM_FWD

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# The exploit of the report, as it was filed: it passed `validate` and would have run at
# `validate --compile` and at every kernel call.
EXPLOIT = "__import__('os').system('touch /tmp/p') or 4"
WARPS = "one of 1, 2, 4, 8, 16, 32"
BLOCKS = "a power of two from 1 to 1048576"

# (field, value, what the one line must say is allowed)
BAD_VALUES = [
    pytest.param("num_warps", EXPLOIT, WARPS, id="exploit"),
    pytest.param("num_warps", 3, WARPS, id="warps-3"),
    pytest.param("num_warps", 1000000, WARPS, id="warps-1e6"),
    pytest.param("num_warps", "eight", WARPS, id="warps-eight"),
    pytest.param("num_warps", True, WARPS, id="warps-true"),
    pytest.param("block_sizes", [2**40, 1], BLOCKS, id="block-2**40"),
    pytest.param("block_sizes", [6, 1], BLOCKS, id="block-6"),
    pytest.param("block_sizes", [8] * 1000, "at most 128 values", id="block-list-1000"),
    pytest.param("num_stages", 0, "an integer from 1 to 8", id="stages-0"),
    pytest.param("pid_type", "flat'); import os; ('", "'flat', 'xyz', 'persistent_blocked'", id="pid-code"),
    pytest.param("indexing", ["pointer", "__import__('os')"], "'pointer', 'tensor_descriptor' or 'block_ptr'",
                 id="indexing-code"),
    pytest.param("loop_orders", [[0, 0]], "a permutation of 0..n-1", id="loop-order"),
    pytest.param("advanced_controls_file", "/etc/passwd", "not a Helion config key a bundle may set",
                 id="unknown-key"),
]


def _with_bad_config(path: Path, field: str, value: object) -> tuple[str, str]:
    """A valid two-entry bundle at `path`, then one entry's config edited by hand as a pull
    request could (the models refuse to build it). Returns (good key, bad key)."""
    good = entry(dims=norm_dims(rows=64, d=64, group_size=32), config={"block_sizes": [4, 1], "num_warps": 8})
    bad = entry(dims=norm_dims(rows=128, d=64, group_size=32))
    write_bundle(bundle(good, bad), path)
    data = json.loads(path.read_text())
    data["entries"][bad.key]["config"][field] = value
    path.write_text(json.dumps(data, indent=2))
    return good.key, bad.key


def _one_line(text: str) -> str:
    # `validate` shows its progress on stderr ("[1/1] checking FILE"); the error is the one other line.
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not re.match(r"\[\d+/\d+\] checking ", ln)]
    assert len(lines) == 1, text
    return lines[0]


def _names_it(line: str, path: Path, key: str, field: str, allowed: str) -> None:
    assert str(path) in line and repr(key) in line and f"config.{field}" in line and allowed in line, line


@pytest.mark.parametrize("field,value,allowed", BAD_VALUES)
def test_load_refuses_a_bad_config_value_in_one_line(tmp_path, field, value, allowed):
    p = tmp_path / "b.json"
    _, bad = _with_bad_config(p, field, value)
    with pytest.raises(BundleError) as e:
        load_bundle(p)
    _names_it(_one_line(str(e.value)), p, bad, field, allowed)


@pytest.mark.parametrize("field,value,allowed", BAD_VALUES)
def test_validate_refuses_a_bad_config_value_with_exit_2_and_one_line(tmp_path, field, value, allowed):
    p = tmp_path / "b.json"
    _, bad = _with_bad_config(p, field, value)
    r = runner.invoke(app, ["validate", str(p)])
    assert r.exit_code == 2, r.output
    _names_it(_one_line(r.stderr), p, bad, field, allowed)
    assert r.stdout == ""


def test_the_exploit_runs_nowhere(tmp_path):
    """`validate --compile`, merge, diff and the run-time loader meet the exploit, aimed at a
    file of this test: each refuses it (the loader skips the entry) and nothing creates the file."""
    marker = tmp_path / "pwned"
    p = tmp_path / "h200" / "evil.json"
    good_key, bad_key = _with_bad_config(p, "num_warps", EXPLOIT.replace("/tmp/p", str(marker)))
    clean = tmp_path / "clean.json"
    write_bundle(bundle(entry(dims=norm_dims(rows=64, d=64, group_size=32))), clean)

    r = runner.invoke(app, ["validate", "--compile", "--lower", str(p)])
    assert r.exit_code == 2 and "config.num_warps" in _one_line(r.stderr), r.output
    out = tmp_path / "merged.json"
    for args in (["merge", str(clean), str(p), "-o", str(out)], ["diff", str(clean), str(p)],
                 ["diff", str(p), str(clean)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        _names_it(_one_line(r.stderr), p, bad_key, "num_warps", WARPS)
    assert not out.exists()

    messages: list[str] = []
    store = runtime.ConfigStore([tmp_path / "h200"], None, messages.append)
    mode = runtime.Mode.exact
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=128, d=64, group_size=32), "bf16", mode).config is None
    kept = store.resolve(GATED_NORM_FWD, norm_dims(rows=64, d=64, group_size=32), "bf16", mode)
    assert kept.config == {"block_sizes": [4, 1], "num_warps": 8} and kept.key == good_key
    (line,) = messages
    assert line.startswith("ignoring bundle entry: ") and "default config" in line
    _names_it(line, p, bad_key, "num_warps", WARPS)
    assert not marker.exists()


@pytest.mark.parametrize("field,value,allowed", BAD_VALUES)
def test_the_run_time_loader_skips_only_the_bad_entry(tmp_path, field, value, allowed):
    p = tmp_path / "h200" / "b.json"
    good_key, bad_key = _with_bad_config(p, field, value)
    messages: list[str] = []
    store = runtime.ConfigStore([tmp_path], None, messages.append)
    exact = runtime.Mode.exact
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=64, d=64, group_size=32), "bf16", exact).key == good_key
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=64, d=64, group_size=32), "bf16", exact).config is not None
    assert store.resolve(GATED_NORM_FWD, norm_dims(rows=128, d=64, group_size=32), "bf16", exact).config is None
    (line,) = messages
    _names_it(line, p, bad_key, field, allowed)


def test_the_models_never_hold_or_write_a_bad_config(tmp_path):
    with pytest.raises(ValidationError, match="num_warps: must be one of 1, 2, 4, 8, 16, 32"):
        entry(config={"block_sizes": [4, 1], "num_warps": EXPLOIT})
    good = entry()
    smuggled = good.model_copy(update={"config": {"block_sizes": [4, 1], "num_warps": "eight"}})  # no validation
    with pytest.raises(BundleError, match=r"config\.num_warps"):
        write_bundle(bundle(good).model_copy(update={"entries": {good.key: smuggled}}), tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_every_shipped_bundle_loads_unchanged():
    paths = find_bundles([ROOT / "generated_configs"])
    assert len(paths) >= 6
    for path in paths:
        text = path.read_text()
        b = load_bundle(path)
        assert all(schema_problem(e.config) is None for e in b.entries.values()), path
        assert path.read_text() == text


def test_the_keys_the_shipped_bundles_use_are_all_known():
    """The schema covers what tuning writes: every key of every shipped config (a sweep that
    starts writing a new key must add it to config_schema.RULES, or its bundle fails to load)."""
    from mamba_tune.config_schema import RULES

    used = {k for p in find_bundles([ROOT / "generated_configs"]) for e in load_bundle(p).entries.values()
            for k in e.config}
    assert used and used <= set(RULES), used - set(RULES)


# Compiled mode, as on the GPU, with the launch replaced by a compile of the launched Triton
# kernel to an sm_90 cubin (lowering.cubin_launcher): Triton's whole compiler runs where a GPU's
# first launch runs it. The runtime's device check is lifted (the CPU cannot launch); all else is
# the runtime's own path: the bundle's entry resolved, checked against the kernel's config
# space, compiled by Helion, launched.
COMPILE_FAILS = """
import sys, warnings
import torch
from autotune_cli.lowering import cubin_launcher
from mamba_tune import runtime
from mamba_tune.norm.gated import GATED_NORM_FWD

x = torch.empty(4096, 1, 512, dtype=torch.bfloat16)  # rows=4096, one group of 512
w = torch.ones(1, 512)
args = (x, x, w, None, 1e-6, False, True)
runtime._check_device = lambda rk, args: None
compiled = []
launch = cubin_launcher(90, compiled)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        out = runtime.lookup(GATED_NORM_FWD, args)(*args, _launcher=launch)
        assert out[0].shape == x.shape
for w_ in caught:
    if issubclass(w_.category, runtime.MambaTuneWarning):
        print("W", w_.message)
for source in runtime.resolutions().values():
    print("R", source)
# What the default config launches, compiled the same way, against what the three calls ran.
bound = GATED_NORM_FWD.kernel.bind(args)
dims = GATED_NORM_FWD.dims_from_args(args)
default = []
bound.compile_config(GATED_NORM_FWD.default_for(bound, dims), allow_print=False)(*args, _launcher=cubin_launcher(90, default))
print("RAN", [c.asm["ptx"] == default[0].asm["ptx"] for c in compiled])
"""


def test_a_bundle_config_that_cannot_compile_warns_once_and_runs_the_default(tmp_path, clean_env):
    """block_sizes [4096, 1] at 4096 rows of 512: the schema and the kernel's config space allow
    it, Helion generates its code, and Triton refuses it at the first launch (a tile of 2M
    values, over its largest tensor). The call still returns, from the default config; the
    warning names the entry and the bundle once; later calls run the default, never retrying."""
    dims = norm_dims(rows=4096, d=512, group_size=512)
    write_bundle(bundle(entry(dims=dims, config={"block_sizes": [4096, 1], "num_warps": 4})), tmp_path / "big.json")
    r = subprocess.run([sys.executable, "-c", COMPILE_FAILS], env={**clean_env, runtime.ENV_CONFIGS: str(tmp_path)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    warned = [ln for ln in r.stdout.splitlines() if ln.startswith("W ")]
    assert len(warned) == 1, r.stdout
    key = entry(dims=dims).key
    assert f"the config for {key} (exact {tmp_path / 'big.json'}) failed to compile or launch" in warned[0]
    assert "running the kernel's default config" in warned[0] and "mamba-tune tune gated_norm_fwd" in warned[0]
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("R ")] == [
        f"R default (config failed to compile: exact {tmp_path / 'big.json'})"]
    # The failed config never compiled; each of the three calls launched the default's kernel.
    assert r.stdout.splitlines()[-1] == "RAN [True, True, True]", r.stdout
