"""The tools of "Writing task tools" (docs/writing-tools.md): one app, each tool a section the page includes.

celery-mcp-tasks dev examples.guide.tools
"""

# --8<-- [start:app]
import time
import urllib.request

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

from celery_mcp_tasks import McpTasks, TaskContext, elicit

tasks = McpTasks("guide")
celery = tasks.celery  # `celery -A examples.guide.tools worker` finds the Celery app here
# --8<-- [end:app]


# --8<-- [start:progress]
@tasks.mcp_task
def crunch(steps: int, ctx: TaskContext) -> str:
    """Crunch numbers, saying how far along the job is."""
    for step in range(1, steps + 1):
        ctx.progress(f"Step {step} of {steps}", current=step, total=steps)
        time.sleep(0.2)
    return f"Crunched {steps} steps."


# --8<-- [end:progress]


# --8<-- [start:question]
@tasks.mcp_task(needs=("elicitation",))
def deploy(service: str, ctx: TaskContext) -> str:
    """Deploy a service once someone confirms it."""
    if "confirm" not in ctx.input_responses:
        ctx.require_input({"confirm": elicit(f"Deploy {service}?", {"ok": bool})}, "Waiting for a yes")
    # Only the second run gets here: require_input ended the first one.
    answer = ctx.input_responses["confirm"]  # {"action": "accept", "content": {"ok": True}}
    if answer["action"] != "accept" or not answer["content"]["ok"]:
        return f"{service}: not deployed"
    return f"{service}: deployed"


# --8<-- [end:question]


# --8<-- [start:cancel]
def scan_one(path: str) -> None:
    time.sleep(0.5)  # stands in for real work on `path`


@tasks.mcp_task
def scan(paths: list[str], ctx: TaskContext) -> str:
    """Scan paths one by one, stopping early once the client cancels."""
    scanned = 0
    for path in paths:
        if ctx.cancelled():  # at most one store read a second: cheap in a loop
            break  # the task is `cancelled` already; whatever this returns is dropped
        scan_one(path)
        scanned += 1
    return f"Scanned {scanned} of {len(paths)} paths."


# --8<-- [end:cancel]


# --8<-- [start:terminate]
@tasks.mcp_task(terminate=True)
def render(frames: int, ctx: TaskContext) -> str:
    """Render frames in a library that never checks back: a cancel revokes the running job."""
    time.sleep(frames)  # stands in for a long call into C that reads no `ctx`
    return f"Rendered {frames} frames."


# --8<-- [end:terminate]


# --8<-- [start:retries]
@tasks.mcp_task(autoretry_for=(OSError,), max_retries=2, default_retry_delay=0.5)
def fetch(url: str, ctx: TaskContext) -> str:
    """Fetch a page; a network error is retried twice (the task stays `working` meanwhile)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return f"{url}: {len(response.read())} bytes"


# --8<-- [end:retries]


# --8<-- [start:results]
class Forecast(BaseModel):
    city: str
    high_c: float
    low_c: float


@tasks.mcp_task
def forecast(city: str, ctx: TaskContext) -> Forecast:
    """A structured result: the task's result carries `structuredContent` and its JSON text."""
    if not city.strip():
        raise ToolError("Name a city.")  # the task completes with isError: true, for the model to read
    return Forecast(city=city, high_c=21.5, low_c=12.0)


# --8<-- [end:results]
