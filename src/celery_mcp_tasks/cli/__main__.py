"""`python -m celery_mcp_tasks.cli`: the same as the `celery-mcp-tasks` command."""

import sys

from celery_mcp_tasks.cli import main

sys.exit(main())
