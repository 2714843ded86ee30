"""The MAMBA_TUNE_* environment, one rule (mamba_tune.env): each variable's bad value is one line
naming the variable and its allowed values, at `import mamba_tune` and where it is read; the
registry of per-shape code-path choices (mamba_tune.paths); docs/paths.md generated from both."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mamba_tune import env, paths

ROOT = Path(__file__).resolve().parents[2]

# (variable, a value it does not allow, what the one line must say)
BAD = [
    ("MAMBA_TUNE_CONFIGS", "/nonexistent", "MAMBA_TUNE_CONFIGS='/nonexistent': /nonexistent does not exist; "
                                           "expected bundle files (.json) or folders"),
    ("MAMBA_TUNE_CONFIGS", str(ROOT / "pyproject.toml"), "is neither a folder nor a .json bundle"),
    ("MAMBA_TUNE_CONFIG_MODE", "bogus", "MAMBA_TUNE_CONFIG_MODE='bogus'; expected exact, nearest or default"),
    ("MAMBA_TUNE_PATCH_MAMBA_SSM", "yes", "MAMBA_TUNE_PATCH_MAMBA_SSM='yes'; expected 0, 1 or strict"),
    ("MAMBA_TUNE_PATCH_TRANSFORMERS", "on", "MAMBA_TUNE_PATCH_TRANSFORMERS='on'; expected 0, 1 or strict"),
    ("MAMBA_TUNE_RECORD", "/tmp/", "MAMBA_TUNE_RECORD='/tmp/': /tmp/ is a folder; expected a file path"),
    ("MAMBA_TUNE_UNSAFE_GPU_SEQ_IDX", "1", "MAMBA_TUNE_UNSAFE_GPU_SEQ_IDX: removed; the fused chunk scan it "
                                           "unlocked with seq_idx on a GPU (C B^T inside F5, measured slower) is "
                                           "deleted"),
    ("MAMBA_TUNE_SEARCH_LOG", "off", "MAMBA_TUNE_SEARCH_LOG='off'; expected 0 or 1"),
    ("MAMBA_TUNE_GIT_SHA", "main", "MAMBA_TUNE_GIT_SHA='main'; expected a commit hash"),
    ("MAMBA_TUNE_REQUIRE_SLURM", "true", "MAMBA_TUNE_REQUIRE_SLURM='true'; expected 0 or 1"),
    ("MAMBA_TUNE_SSD_SP_BWD", "walk", "MAMBA_TUNE_SSD_SP_BWD='walk'; expected fused or split"),
    ("MAMBA_TUNE_SSD_DBDC", "three", "MAMBA_TUNE_SSD_DBDC='three'; expected one or two"),
    ("MAMBA_TUNE_SSD_DBDC_SUM", "kernel", "MAMBA_TUNE_SSD_DBDC_SUM: removed; torch adds the dB/dC head runs; the "
                                          "one-kernel fold (not promoted) is experiments/dbdc_runs_sum/"),
    ("MAMBA_TUNE_CONV1D_BWD", "slide", "MAMBA_TUNE_CONV1D_BWD: removed; the conv1d backward is the slide kernel for channel-last calls"),
    ("MAMBA_TUNE_SSD_DBDC_SIDES", "1", "MAMBA_TUNE_SSD_DBDC_SIDES: removed; dC and dB always run"),
    ("MAMBA_TUNE_SSD_DBDC_SPLITS", "4", "MAMBA_TUNE_SSD_DBDC_SPLITS: removed;"),
    ("MAMBA_TUNE_CONFIG", "/tmp", "MAMBA_TUNE_CONFIG: no such mamba-tune variable (did you mean MAMBA_TUNE_CONFIGS?)"),
]

GOOD = [
    ("MAMBA_TUNE_CONFIGS", str(ROOT / "generated_configs"), [ROOT / "generated_configs"]),
    ("MAMBA_TUNE_CONFIG_MODE", "exact", "exact"),
    ("MAMBA_TUNE_PATCH_MAMBA_SSM", " Strict", "strict"),
    ("MAMBA_TUNE_RECORD", "calls.json", Path("calls.json")),
    ("MAMBA_TUNE_SEARCH_LOG", "0", False),
    ("MAMBA_TUNE_GIT_SHA", "0a2459e-dirty", "0a2459e-dirty"),
    ("MAMBA_TUNE_SSD_DBDC", "two", "two"),
    ("MAMBA_TUNE_CONFIG_MODE", "", None),  # empty: unset
]


def test_every_variable_has_a_bad_value_case():
    assert set(env.variables()) <= {name for name, _, _ in BAD}


@pytest.mark.parametrize(("name", "value", "says"), BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_variable(name, value, says, monkeypatch):
    monkeypatch.setenv(name, value)
    for check in (env.check, lambda: env.read(name)):
        with pytest.raises(env.MambaTuneEnvironmentError) as e:
            check()
        assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("name", "value", "want"), GOOD, ids=[f"{n}={v}" for n, v, _ in GOOD])
def test_allowed_values_parse(name, value, want, monkeypatch):
    monkeypatch.setenv(name, value)
    env.check()
    assert env.read(name) == want


def test_the_runtime_reads_its_variables_through_the_one_parser(monkeypatch):
    """The mode used to warn and carry on with nearest; a path override used to fail only in the backward."""
    from mamba_tune import runtime
    from mamba_tune.ssd import combined

    monkeypatch.setenv("MAMBA_TUNE_CONFIG_MODE", "bogus")
    with pytest.raises(env.MambaTuneEnvironmentError, match="MAMBA_TUNE_CONFIG_MODE='bogus'"):
        runtime.current_mode()
    monkeypatch.setenv("MAMBA_TUNE_CONFIG_MODE", "default")
    assert runtime.current_mode() is runtime.Mode.default
    assert combined._sp_bwd_split(2, 4, 128)  # the rule: few chains
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", "fused")
    assert not combined._sp_bwd_split(2, 4, 128)
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", "walk")
    with pytest.raises(env.MambaTuneEnvironmentError, match="MAMBA_TUNE_SSD_SP_BWD='walk'; expected fused or split"):
        combined._sp_bwd_split(2, 4, 128)


def _python(code: str, **variables: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    return subprocess.run([sys.executable, "-c", code], env={**environ, **variables}, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_import_refuses_a_bad_value_and_stays_light():
    r = _python("import mamba_tune", MAMBA_TUNE_CONFIGS="/nonexistent")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith("MAMBA_TUNE_CONFIGS='/nonexistent': /nonexistent does not "
                                                      "exist; expected bundle files (.json) or folders of "
                                                      "<sku>/<name>.json that exist, separated by ':'"), r.stderr
    # The check loads no torch (the registry is torch-free), and a good value passes.
    r = _python("import sys, mamba_tune; print('torch' in sys.modules)", MAMBA_TUNE_SSD_DBDC="two",
                MAMBA_TUNE_CONFIGS="/")
    assert r.returncode == 0 and r.stdout.split() == ["False"], r.stderr


def test_the_cli_reports_a_bad_value_as_bad_input():
    r = _python("from autotune_cli.app import main; main()", MAMBA_TUNE_CONFIG_MODE="bogus")
    assert r.returncode == 2
    assert r.stderr == "mamba-tune: MAMBA_TUNE_CONFIG_MODE='bogus'; expected exact, nearest or default\n"


def test_bundle_folders_are_read_two_levels_deep_only(tmp_path):
    """<root>/<sku>/<name>.json, or a SKU's folder itself: MAMBA_TUNE_CONFIGS=/ does not walk the disk."""
    from mamba_tune.bundle import find_bundles

    for rel in ("top.json", "h200/model.json", "h200/deeper/not-a-bundle.json", "a/b/c/d.json", "h200/.hidden.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    assert find_bundles([tmp_path]) == [tmp_path / "h200/model.json", tmp_path / "top.json"]
    # Given a SKU's folder, its files and one level below it.
    assert find_bundles([tmp_path / "h200"]) == [tmp_path / "h200/deeper/not-a-bundle.json",
                                                 tmp_path / "h200/model.json"]


def test_each_choice_names_real_kernels_and_its_rule():
    from mamba_tune.keys import all_keys

    keys = all_keys()
    for p in paths.PATHS.values():
        assert p.var.startswith(env.PREFIX) and len(p.choices) >= 2, p.name
        for kernels in p.choices.values():
            assert set(kernels) <= set(keys), (p.name, kernels)
        # A per-shape rule, "module.function": no fixed default form.
        assert p.rule not in p.choices, p.name
        module, _, function = p.rule.rpartition(".")
        assert callable(getattr(importlib.import_module(module), function)), p.rule


def test_choose_takes_the_rule_unless_the_variable_forces_one(monkeypatch):
    monkeypatch.delenv("MAMBA_TUNE_SSD_DBDC", raising=False)
    assert paths.choose("ssd_dbdc", "two") == "two"
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC", "one")
    assert paths.choose("ssd_dbdc", "two") == "one"
    with pytest.raises(ValueError, match="ssd_dbdc: the rule chose 'three'"):
        paths.choose("ssd_dbdc", "three")


def test_docs_paths_md_is_generated_from_the_registry():
    doc = (ROOT / "docs" / "paths.md").read_text()
    how = "regenerate the tables: python -c 'from mamba_tune import env, paths; print(env.markdown()); " \
          "print(paths.markdown())'"
    assert env.markdown() in doc, how
    assert paths.markdown() in doc, how
