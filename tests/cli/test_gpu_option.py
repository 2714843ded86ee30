"""`plan --gpu SKU` and `check --gpu SKU`: a spec read for another SKU of its target's arch, with
that SKU's `shipped` part; a bad SKU is one line and exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune_cli.app import app

ROOT = Path(__file__).resolve().parents[2]
NANO = str(ROOT / "sweeps" / "nemotron-nano.yaml")
# What only the H100 part of Nano holds: the three kernels the fused backward changed and the
# conv1d's layer kernels at the layer's rows.
H100_KERNELS = {"gated_norm_bwd", "ssd_chunk_cumsum_bwd", "ssd_chunk_scan_chunk_state_bwd_dx", "causal_conv1d_fwd",
                "causal_conv1d_bwd_slide"}


def _plan(*args: str) -> dict:
    r = CliRunner().invoke(app, ["plan", NANO, "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_plan_shipped_gpu_h100_lists_the_h100_part():
    h100, h200 = _plan("--shipped", "--gpu", "h100"), _plan("--shipped")
    assert h100["target"]["gpu"] == "h100" and h200["target"]["gpu"] == "h200"
    # TP1 and TP2 at seqlen 8192, with and without seq_idx: the H200's part and the kernels only
    # the H100 has entries for (the conv1d's two, each with and without seq_idx: 8 combos more).
    assert {c["kernel"] for c in h100["combos"]} == H100_KERNELS | {c["kernel"] for c in h200["combos"]}
    assert {c["key"] for c in h200["combos"]} < {c["key"] for c in h100["combos"]}
    assert sum(c["kernel"] in H100_KERNELS for c in h100["combos"]) == 16
    assert {o.split(" seqlen")[0] for c in h100["combos"] for o in c["origins"]} == {
        "nemotron-3-nano-30b tp=1 batch=2", "nemotron-3-nano-30b tp=2 batch=2"}
    assert not H100_KERNELS & {c["kernel"] for c in h200["combos"]}
    # Without --shipped, --gpu plans the whole sweep for that SKU.
    assert [c["key"] for c in _plan("--gpu", "h100")["combos"]] == [c["key"] for c in _plan()["combos"]]


def test_check_gpu_h100_reads_only_the_h100_folder(tmp_path: Path) -> None:
    # Only an h200 bundle: for the h100 nothing is covered; its entries are a sibling's, not tuned for it.
    (tmp_path / "h200").mkdir()
    shutil.copy(ROOT / "generated_configs" / "h200" / "nemotron-nano.json", tmp_path / "h200")
    counts = {}
    for flag in ([], ["--shipped"]):
        r = CliRunner().invoke(app, ["check", NANO, "--gpu", "h100", *flag, "--bundles", str(tmp_path),
                                     "--format", "json"])
        assert r.exit_code == 1, r.output
        result = json.loads(r.stdout)
        assert (result["sku"], result["folder"]) == ("h100", (tmp_path / "h100").as_posix())
        counts[bool(flag)] = result["counts"]
    # The h100 part: the kernels with no h200 entry here missing (H100_KERNELS: the h200 bundle has no
    # conv1d entry at the layer's rows), the rest held only by the sibling.
    assert counts[True] == {"ok": 0, "missing": 16, "stale": 0, "sibling": 18}
    assert counts[False]["ok"] == 0 and counts[False]["sibling"] > 0


@pytest.mark.parametrize("command", ["plan", "check"])
@pytest.mark.parametrize("gpu, expected", [
    ("h300", "--gpu 'h300': unknown GPU SKU; known: a100"),
    ("b200", "--gpu b200 is sm100, but the spec targets h200 (sm90); give a SKU of sm90: h100, h200, gh200"),
])
def test_an_unknown_gpu_or_one_of_another_arch_is_one_line(tmp_path: Path, command: str, gpu: str,
                                                          expected: str) -> None:
    extra = ["--bundles", str(tmp_path)] if command == "check" else []
    r = CliRunner().invoke(app, [command, NANO, "--gpu", gpu, "--shipped", *extra])
    assert r.exit_code == 2
    assert r.stdout == ""
    assert r.stderr.startswith(f"error: {NANO}: {expected}") and r.stderr.count("\n") == 1, r.stderr


def test_shipped_for_a_sku_the_spec_names_no_part_for_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    text = Path(NANO).read_text(encoding="utf-8")
    spec.write_text(text[: text.index("  # The H100-tuned entries")], encoding="utf-8")
    r = CliRunner().invoke(app, ["plan", str(spec), "--shipped", "--gpu", "h100"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: {spec}: no 'shipped' section for h100 (it has a part for h200 only)")


def test_sweep_shipped_without_a_part_for_the_gpu_it_would_tune_is_one_line(tmp_path: Path) -> None:
    # Only an h100 part: on a machine without a GPU (as here, or a Slurm submitter) `sweep --shipped`
    # tunes the target's part, which the spec does not name: refused before anything is tuned.
    spec = tmp_path / "s.yaml"
    text = Path(NANO).read_text(encoding="utf-8")
    head, h100 = text[: text.index("  h200:\n")], text[text.index("  h100:\n"):]
    spec.write_text(head + h100, encoding="utf-8")
    r = CliRunner().invoke(app, ["sweep", str(spec), "--shipped", "--allow-gpu-mismatch", "--out",
                                 str(tmp_path / "out")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: {spec}: no 'shipped' section for h200 (it has a part for h100 only)")
    assert not (tmp_path / "out").exists()


def test_check_given_an_sku_folder_instead_of_the_root_is_one_line(tmp_path: Path) -> None:
    # `--bundles generated_configs/h100`: the bundles sit in DIR itself and DIR/h100 does not
    # exist, so every combo would read as missing; the error names the root to give instead.
    sku_dir = tmp_path / "h100"
    sku_dir.mkdir()
    shutil.copy(ROOT / "generated_configs" / "h100" / "nemotron-nano.json", sku_dir)
    r = CliRunner().invoke(app, ["check", NANO, "--gpu", "h100", "--bundles", str(sku_dir)])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: --bundles {sku_dir} holds bundles itself, and {sku_dir / 'h100'} does not "
                               "exist") and r.stderr.count("\n") == 1, r.stderr
    assert f"--bundles {tmp_path})" in r.stderr
