"""The sweep ledger's contract: the row it keeps for each sweeping duty, and what a ledger does.

Plain values and a protocol, imported by the `Store` contract (`store.base`), the console's
overview (`store.rows`) and the operations' readers; the ledger on SQL is `store.sweeps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

__all__ = ["JANITOR", "Ledger", "SweepRecord"]

JANITOR: Final = "janitor"
"""The janitor's row in the ledger."""


@dataclass(frozen=True)
class SweepRecord:
    """One duty's row: the last recorded sweep (None before the first) and the current claim.

    `read_at` is the database's clock when the row was read (None for a record made
    by hand): ages are measured against it, so they hold whatever this host's clock says.
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

    def record(self, name: str, *, duration_ms: int, report: dict[str, int], statuses: dict[str, int]) -> None:
        """A sweep that just ended after `duration_ms`."""
        ...
