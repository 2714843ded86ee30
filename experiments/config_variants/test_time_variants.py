"""The config-variant probe on the CPU: its arguments, the variants it makes, its exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from time_variants import parse_set, variants  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("time_variants.py")


def test_parse_set_reads_fields_indices_and_json_values():
    assert parse_set("block_sizes[0]=64,128") == ("block_sizes", 0, [64, 128])
    assert parse_set("num_warps=4") == ("num_warps", None, [4])
    assert parse_set("pid_type=flat,persistent_blocked") == ("pid_type", None, ["flat", "persistent_blocked"])
    for bad in ("num_warps", "num_warps=", "Block[x]=1"):
        with pytest.raises(ValueError, match="expected FIELD=V1,V2"):
            parse_set(bad)


def test_variants_are_the_cross_product_with_the_config_first():
    config = {"block_sizes": [64, 128], "num_warps": 4}
    got = variants(config, [parse_set("block_sizes[0]=128,64"), parse_set("num_warps=8,4")])
    assert got[0] == config and len(got) == 4
    assert {(c["block_sizes"][0], c["num_warps"]) for c in got} == {(64, 4), (64, 8), (128, 4), (128, 8)}
    assert config == {"block_sizes": [64, 128], "num_warps": 4}  # not changed in place
    with pytest.raises(ValueError, match="has no field 'warps'"):
        variants(config, [parse_set("warps=8")])
    with pytest.raises(ValueError, match=r"block_sizes\[2\]"):
        variants(config, [parse_set("block_sizes[2]=8")])


def test_bad_arguments_and_no_gpu_exit_2_with_one_line(tmp_path):
    bundle = ROOT / "generated_configs/h100/nemotron-nano.json"
    r = subprocess.run([sys.executable, str(SCRIPT), str(bundle), "nope|x=1|bf16"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == f"time_variants.py: {bundle}: no entry 'nope|x=1|bf16'"
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import json

    key = next(iter(json.loads(bundle.read_text())["entries"]))
    r = subprocess.run([sys.executable, str(SCRIPT), str(bundle), key, "--set", "num_warps=8"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == "time_variants.py: needs a CUDA GPU", r.stderr
