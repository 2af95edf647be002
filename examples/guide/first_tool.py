"""Getting started, "your first tool in five minutes" (docs/getting-started.md), where it is `words.py`.

The test writes the section below to a scratch directory as `words.py` and runs the page's command
there (`celery-mcp-tasks dev words --call count_words ...`), as a reader would; from a clone the
same tool is `celery-mcp-tasks dev examples.guide.first_tool`.
"""

# --8<-- [start:tool]
import time

from celery_mcp_tasks import McpTasks, TaskContext

tasks = McpTasks("words")
celery = tasks.celery  # `celery -A words worker` finds the Celery app here


@tasks.mcp_task
def count_words(text: str, ctx: TaskContext) -> dict[str, int]:
    """Count how often each word occurs in a text, a line at a time."""
    lines = text.splitlines()
    counts: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        ctx.progress(f"Counting line {n} of {len(lines)}", current=n, total=len(lines))
        for word in line.lower().split():
            counts[word] = counts.get(word, 0) + 1
        time.sleep(0.5)  # stands in for real work
    return counts


# --8<-- [end:tool]
