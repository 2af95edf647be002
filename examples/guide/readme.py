"""The README's 20-line example (and the docs' home page): tests/test_docs_examples.py keeps the two identical.

celery-mcp-tasks dev examples.guide.readme --call write_report '{"topic": "tides"}'
"""

# --8<-- [start:readme]
import time

from celery_mcp_tasks import McpTasks, TaskContext, elicit

tasks = McpTasks("reports")
celery = tasks.celery  # `celery -A reports worker` finds the Celery app here


@tasks.mcp_task(needs=("elicitation",))
def write_report(topic: str, ctx: TaskContext, sections: int = 3) -> str:
    """Write a short report on a topic, one section at a time, once someone confirms it."""
    if "go" not in ctx.input_responses:  # ask first: this run ends, the answer starts the next
        ctx.require_input({"go": elicit(f"Write {sections} sections on {topic}?", {"ok": bool})})
    answer = ctx.input_responses["go"]  # {"action": "accept", "content": {"ok": True}}, or a decline
    if answer["action"] != "accept" or not answer["content"]["ok"]:
        return f"No report on {topic}."
    for n in range(1, sections + 1):
        if ctx.cancelled():
            break
        ctx.progress(f"Writing section {n} of {sections}", current=n - 1, total=sections)
        time.sleep(1)
    return f"A {sections}-section report on {topic}."


# --8<-- [end:readme]
