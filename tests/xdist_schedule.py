"""pytest plugin (loaded by tests/conftest.py): how the README's test command (`-n 2 --dist
loadgroup`) shares the suite between its pytest-xdist workers. Only loadgroup's workers change
anything; a run without pytest-xdist keeps pytest's order.

- Each `xdist_group` stays on one worker, whatever the pytest version. pytest-xdist groups tests
  by appending "@group" to their node ids on the workers; 3.8 does that through `item._nodeid`,
  which pytest 9.2 no longer reads (a node id there is `item._id`, a NodeId), so every group was
  ignored: both CI workers started a Slurm cluster and lowered every case of each lowering
  module (about 75 s each, twice). Where the suffix is missing, it is added here.
- The tests marked `slow` are handed out first (groups of several tests still go before single
  tests: xdist's own order). In collection order the slowest single test (the lowering of every
  default config and bundle entry, 3-4 min) came near the end, and one worker ran it alone
  while the other had run out of work.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own renaming
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", default=False):  # set on loadgroup's workers only
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if not names or item.nodeid.endswith(suffix):
            continue
        from _pytest.nodeid import NodeId  # pytest >= 9.2 (before it, xdist's renaming worked)

        item._id = NodeId.parse(item.nodeid + suffix)
    # The controller hands out work in the workers' collection order; both workers sort alike.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
