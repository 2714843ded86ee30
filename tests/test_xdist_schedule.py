"""The README's test command (`-n 2 --dist loadgroup`) shares the suite as tests/xdist_schedule.py
says: each xdist_group on one worker (the Slurm tests share one cluster, each lowering module lowers
its cases once) and the `slow` tests handed out first. Checked on a small suite run by a real
pytest-xdist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import xdist_schedule

SUITE = '''
import os, time, pytest

def record(name):
    with open(OUT / "order", "a") as f:
        f.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    time.sleep(0.1)
    record(f"free-{i}")

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    time.sleep(0.1)
    record(f"grouped-{i}")

@pytest.mark.slow
def test_slow():
    time.sleep(0.1)
    record("slow")
'''


def test_the_suite_loads_the_plugin(request: pytest.FixtureRequest) -> None:
    hooks = request.config.pluginmanager.hook.pytest_collection_modifyitems.get_hookimpls()
    assert xdist_schedule.pytest_collection_modifyitems in [h.function for h in hooks]


def test_groups_stay_on_one_worker_and_slow_tests_go_first(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(f"from pathlib import Path\nOUT = Path({str(tmp_path)!r})\n{SUITE}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HELION_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist_schedule", "-p", "no:cacheprovider",
                        "-o", "markers=slow: slow", "-n", "2", "--dist", "loadgroup", "-q", "test_suite.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    order = [line.split() for line in (tmp_path / "order").read_text().splitlines()]
    assert len(order) == 13, order
    grouped = {worker for name, worker in order if name.startswith("grouped")}
    assert len(grouped) == 1, f"the group ran on several workers: {order}"
    single = [name for name, _ in order if not name.startswith("grouped")]
    assert single[0] == "slow", f"the slow test was not handed out first: {order}"
