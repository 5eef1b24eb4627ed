"""The cluster suite needs Debian's etcd-server (/usr/bin/etcd). Without it every test here skips,
and the run says so once, loudly, on stderr and in each skip reason."""

import os
import sys

import pytest

from tests import system_tools
from tests.cluster.harness.etcd import etcd_installed

REASON = system_tools.missing_message("etcd", "the cluster suite (tests/cluster/)")
_said = []


NIGHTLY = "QUEEN_CLUSTER_NIGHTLY"


def pytest_collection_modifyitems(config, items):
    if not os.environ.get(NIGHTLY):
        for item in items:
            if item.get_closest_marker("nightly"):
                item.add_marker(pytest.mark.skip(reason=f"nightly scenario: set {NIGHTLY}=1 to run it"))
    if etcd_installed():
        return
    mine = [item for item in items if "tests/cluster/" in str(item.path).replace("\\", "/")]
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=REASON))
    if mine and not _said:
        _said.append(True)
        print(f"\n{REASON}", file=sys.stderr)

