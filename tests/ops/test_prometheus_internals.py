"""Contract tests for every prometheus_client internal this package uses (`celery_mcp_tasks.ops.prometheus_internals`).

Each fails with the installed version in its message the day the internal moves.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from celery_mcp_tasks.ops import prometheus_internals

VERSION = importlib.metadata.version("prometheus_client")
WHERE = f"prometheus_client {VERSION}: an internal moved; update celery_mcp_tasks/ops/prometheus_internals.py"


def test_the_release_is_one_this_module_was_checked_against() -> None:
    assert VERSION.rsplit(".", 1)[0] in prometheus_internals.VERSIONS, WHERE


@pytest.mark.integration
def test_a_metric_made_after_count_in_files_counts_in_the_directory(tmp_path: Path) -> None:
    """In a fresh process (the value class is process-wide): memory first, files once switched."""
    probe = (
        "import os, sys; from celery_mcp_tasks.ops import prometheus_internals as p; "
        "import prometheus_client; "
        "before = p.counts_in_files(); "
        f"os.environ['PROMETHEUS_MULTIPROC_DIR'] = {str(tmp_path)!r}; p.count_in_files(); "
        "c = prometheus_client.Counter('probe', 'probe', registry=None); c.inc(3); "
        "print(before, p.counts_in_files(), sorted(os.listdir(os.environ['PROMETHEUS_MULTIPROC_DIR'])))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{WHERE}\n{out.stderr}"
    before, after, files = out.stdout.split(" ", 2)
    assert (before, after) == ("False", "True"), WHERE
    assert "counter_" in files, WHERE


def test_values_written_are_read_back_from_a_multiprocess_file(tmp_path: Path) -> None:
    from prometheus_client.mmap_dict import mmap_key

    key = mmap_key("m", "m_total", ["tool"], ["t"], "")
    path = str(tmp_path / "counter_1.db")
    prometheus_internals.write_values(path, {key: 2.5})
    assert list(prometheus_internals.read_values(path)) == [(key, 2.5)], WHERE
