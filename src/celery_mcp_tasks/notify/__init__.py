"""Change notification: the Notifier seam, the in-process hub and the cross-process transports."""

from celery_mcp_tasks.notify.base import Notifier, safe_notify

__all__ = ["Notifier", "safe_notify"]
