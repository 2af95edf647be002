"""Task state storage: the `Store` protocol and its SQLAlchemy implementation."""

from celery_mcp_tasks.store.base import (
    ANY,
    Owner,
    Store,
    StoreConflict,
    StoreUnavailable,
    TaskLimitReached,
    TaskNotFound,
)

__all__ = ["ANY", "Owner", "Store", "StoreConflict", "StoreUnavailable", "TaskLimitReached", "TaskNotFound"]
