"""Tests that need an external program skip without it on a developer's machine and fail in CI."""

from __future__ import annotations

import pytest

from tests import support


def test_a_missing_tool_skips_with_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "REQUIRE_TOOLS", False)
    with pytest.raises(pytest.skip.Exception, match=r"no-such-tool is not installed \(apt-get install it\)"):
        support.tool("no-such-tool", "apt-get install it")


def test_a_missing_tool_fails_where_every_tool_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "REQUIRE_TOOLS", True)
    with pytest.raises(pytest.fail.Exception, match="MCP_TASKS_TEST_REQUIRE_TOOLS"):
        support.tool("no-such-tool", "apt-get install it")
    with pytest.raises(pytest.fail.Exception, match="/nowhere/tool is not installed"):
        support.tool("tool", "apt-get install it", path="/nowhere/tool")


def test_a_present_tool_is_found_on_path_or_at_its_path() -> None:
    assert support.tool("sh", "always there").endswith("/sh")
    assert support.tool("sh", "always there", path="/bin/sh") == "/bin/sh"
