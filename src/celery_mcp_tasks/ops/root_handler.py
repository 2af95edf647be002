"""The root handler this package installs where it owns logging (its commands, the logs plugin).

Named, so `ops.logs` restyles it and never a handler the application configured. Standard library
only: `cli/` and `ops.logs` share it without either importing the other.
"""

from __future__ import annotations

import logging

ROOT_HANDLER = "celery-mcp-tasks"


def plain_root_logging() -> None:
    """One plain line per record on stderr, unless the process configured logging already. Plain on purpose:
    rich's handler (the SDK's `MCPServer` would install it) wraps lines to 80 columns in a container."""
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.set_name(ROOT_HANDLER)
        logging.basicConfig(level="INFO", format="%(message)s", handlers=[handler])
