import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The broker transport needs a networked broker: the embedded backend has none, so that
    pairing is not a test at all (deselected, rather than reported as a skip)."""
    dropped = [item for item in items if "[embedded-broker]" in item.nodeid]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
