"""An app module whose import takes until it is interrupted: Ctrl-C while the CLI is still importing.

It touches the file named by MCP_TASKS_TEST_IMPORTING once its import has begun, so a test
knows when to press Ctrl-C.
"""

import os
import time
from pathlib import Path

Path(os.environ["MCP_TASKS_TEST_IMPORTING"]).touch()
time.sleep(60)
