from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Backend, Deployment, McpHttp


@pytest.fixture(scope="module")
def conformance(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The conformance fixture app: one web process and one separate worker."""
    with Deployment("examples.conformance.app", backend, tmp_path_factory.mktemp(f"logs-{backend.name}")) as deployment:
        deployment.web()
        deployment.worker()
        yield deployment


@pytest.fixture
def client(conformance: Deployment) -> Iterator[McpHttp]:
    http = McpHttp(conformance.url)
    yield http
    http.close()
