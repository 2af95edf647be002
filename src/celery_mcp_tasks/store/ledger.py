"""The sweep ledger's contract (`store.sweeps` is its SQL): the row kept for each sweeping duty, and the protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

JANITOR: Final = "janitor"
"""The janitor's row in the ledger."""


@dataclass(frozen=True)
class SweepRecord:
    """One duty's row: the last recorded sweep (None before the first) and the current claim.

    `read_at`: the database's clock at the read (None for a record made by hand), which ages are measured against.
    """

    name: str
    swept_at: int | None
    duration_ms: int | None
    sweeps: int
    report: dict[str, int]
    statuses: dict[str, int]
    claimed_at: int | None
    claimed_by: str | None
    read_at: int | None = field(default=None, compare=False)


class Ledger(Protocol):
    """The sweep ledger: when each sweeping duty last ran and who may run it next (`store.sweeps`)."""

    def last(self, name: str = ...) -> SweepRecord | None:
        """The duty's row, read on the database's clock (None before its first sweep)."""
        ...

    def claim(self, name: str, *, interval_ms: int, by: str) -> bool:
        """Take the duty for this interval: True for exactly one of any number of claimants at once."""
        ...

    def record(
        self,
        name: str,
        *,
        duration_ms: int,
        report: dict[str, int],
        statuses: dict[str, int],
        swept_at: int | None = None,
    ) -> None:
        """A sweep that just ended after `duration_ms`, begun at `swept_at` on the database's clock (None: that
        clock now, less `duration_ms`)."""
        ...
