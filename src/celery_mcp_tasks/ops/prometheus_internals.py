"""Every place this package reaches past prometheus_client's public API (pinned: 0.26.x).

`tests/ops/test_prometheus_internals.py` fails, naming the installed version, as soon as one moves.
- `values.ValueClass`, chosen once when `values` is imported: a `celery worker` decides to count in
  files after that, so it replaces the class (a public "multiprocess mode now" call would remove it).
- `mmap_dict.MmapedDict`, the files' format, to fold an exited child's counts into one merged file
  (a public "merge these processes' files" would remove it).
"""

from __future__ import annotations

from collections.abc import Iterator

VERSIONS = ("0.26",)  # the prometheus_client releases whose internals this module was checked against


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
