"""The cluster service (runtime/clustering/service.py) before its boot, without sockets.

The transport answers peers before `ClusterService.start` has opened the metadata Raft group (it must:
a joining node is registered through it). A metadata request that arrives in that window is refused as
the cluster being unavailable, which the asking node retries; the service is built as `app.py` builds it,
and the request is fed in as the transport hands it over (a wire value), so no socket is opened.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch.cluster import messages as cm
from hutch.cluster.metadata import Member
from hutch.config import Config
from hutch.runtime.app import build_node, cluster_node
from hutch.runtime.errors import ClusterUnavailable

pytestmark = pytest.mark.asyncio


def _service(tmp_path: Path):
    node = build_node(Config(data_dir=str(tmp_path), node_name="n1@localhost", cluster_port=0),
                      monitor_resources=False, restore=False)
    return cluster_node(node, b"secret")


@pytest.mark.parametrize("request_", [cm.Propose(b"x"), cm.Join("n2@localhost", "127.0.0.1", 1, False)],
                         ids=["propose", "join"])
async def test_a_metadata_request_before_the_group_is_open_is_refused_as_unavailable(tmp_path, request_):
    svc = _service(tmp_path)
    assert svc.group is None
    reply = svc._on_request("n2@localhost", list(cm.to_wire(request_)))
    with pytest.raises(ClusterUnavailable, match="has not opened its metadata group yet"):
        await reply


async def test_forget_before_the_group_is_open_is_refused_as_unavailable(tmp_path):
    svc = _service(tmp_path)
    svc.machine.members["n2@localhost"] = Member("n2@localhost", 2, "127.0.0.1", 1)  # a stopped member
    with pytest.raises(ClusterUnavailable, match="has not opened its metadata group yet"):
        await svc.forget("n2@localhost")

