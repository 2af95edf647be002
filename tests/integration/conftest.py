from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Backend, Deployment, McpHttp


@pytest.fixture(scope="module")
def conformance(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The conformance fixture app: one web process and one separate worker."""
    deployment = Deployment("examples.conformance.app", backend, tmp_path_factory.mktemp(f"logs-{backend.name}"))
    try:
        deployment.web()
        deployment.worker()
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def client(conformance: Deployment) -> Iterator[McpHttp]:
    http = McpHttp(conformance.url)
    yield http
    http.close()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path
