"""Every place this package reaches past prometheus_client's public API, in one module (pinned: 0.26.x).

Each function names the private thing it uses and the public hook that would
remove the need; `tests/ops/test_prometheus_internals.py` fails with the
installed version in its message as soon as one of them moves.

1. `counts_in_files` / `count_in_files`: `prometheus_client.values.ValueClass`,
   the class every metric object is made with, chosen once when `values` is
   imported (files when PROMETHEUS_MULTIPROC_DIR is set then). A `celery worker`
   decides to count in files after prometheus_client may already be imported
   (by the application, by us), so it replaces the class itself. A public
   "enable multiprocess mode now" call would remove both.
2. `read_values` / `write_values`: `prometheus_client.mmap_dict.MmapedDict`,
   the format of the multiprocess files, to fold an exited child's counts into
   one merged file. A public "merge these processes' files" (or a
   `mark_process_dead` that kept counters in one file) would remove both.

prometheus_client is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["VERSIONS", "count_in_files", "counts_in_files", "read_values", "write_values"]

VERSIONS = ("0.26",)
"""The prometheus_client releases whose internals this module was checked against."""


def counts_in_files() -> bool:
    """Whether metric objects made from now on count in multiprocess files."""
    from prometheus_client import values

    return bool(getattr(values.ValueClass, "_multiprocess", False))


def count_in_files() -> None:
    """Make metric objects made from now on count in the files under PROMETHEUS_MULTIPROC_DIR (set it first)."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]


def read_values(path: str) -> Iterator[tuple[str, float]]:
    """(key, value) of every sample in one multiprocess file."""
    from prometheus_client.mmap_dict import MmapedDict

    for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
        yield key, value


def write_values(path: str, values: dict[str, float]) -> None:
    """A new multiprocess file at `path` holding `values` (keys as `read_values` gave them)."""
    from prometheus_client.mmap_dict import MmapedDict

    out = MmapedDict(path)  # type: ignore[no-untyped-call]
    try:
        for key, value in values.items():
            out.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
    finally:
        out.close()  # type: ignore[no-untyped-call]
