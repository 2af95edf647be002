"""The private parts of the SDK's client that `celery_mcp_tasks.client._sdk` uses, pinned to the release.

When one of these moves, this test names the SDK version it fails on, and
`_sdk.py` is the only module to change.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

from mcp.client.session import ClientSession
from mcp.client.subscriptions import ListenRoute

from celery_mcp_tasks.client import _sdk

SDK = version("mcp")


def test_the_sdk_release_is_one_this_module_was_checked_against():
    assert SDK.rsplit(".", 1)[0] in _sdk.SDK_VERSIONS, f"mcp {SDK}: re-check celery_mcp_tasks/client/_sdk.py"


def test_the_session_internals_used_to_open_a_listen_stream_exist():
    source = inspect.getsource(ClientSession)
    for name in ("self._task_group", "self._dispatcher", "self._stamp"):
        assert name in source, f"mcp {SDK}: ClientSession no longer has {name}"
    for method in ("_register_listen_route", "_unregister_listen_route"):
        assert callable(getattr(ClientSession, method, None)), f"mcp {SDK}: ClientSession.{method} is gone"
    assert list(inspect.signature(ClientSession._register_listen_route).parameters) == ["self", "request_id"]


def test_the_listen_route_keeps_its_shape():
    route = ListenRoute()
    for name in ("acked", "honored", "error", "end"):
        assert hasattr(route, name), f"mcp {SDK}: ListenRoute.{name} is gone"
    for method in ("set_acked", "settle", "next_event", "consume"):
        assert callable(getattr(route, method, None)), f"mcp {SDK}: ListenRoute.{method} is gone"
    route.settle("local")
    assert route.end == "local" and route.acked.is_set()


def test_the_acknowledged_filter_keeps_the_task_ids_it_was_not_built_for():
    """`taskIds` is not a core field: the SDK's filter model must keep it (extra='allow')."""
    from mcp_types import SubscriptionFilter

    honored = SubscriptionFilter.model_validate({"taskIds": ["a", "b"]})
    stream = _sdk.TaskStream(ListenRoute(), honored)
    assert stream.task_ids == ["a", "b"]
    assert _sdk.TaskStream(ListenRoute(), SubscriptionFilter()).task_ids is None
