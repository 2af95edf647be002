"""The operators' console inside your own Starlette (or FastAPI) application (docs/console.md).

uvicorn examples.guide.console_mounted:app
"""

# --8<-- [start:console-mounted]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount

from examples.guide.tools import tasks


def operator(request: Request) -> str | None:
    """Your app's authentication decides who may look: the operator's name, or None to refuse."""
    user = request.scope.get("user")  # e.g. set by Starlette's AuthenticationMiddleware
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.display_name)


app = Starlette(
    routes=[
        Mount("/console", app=tasks.console_app(path="/console", operator=operator)),
        Mount("/", app=tasks.asgi_app()),  # MCP at /mcp
    ],
    lifespan=tasks.lifespan,  # runs the MCP app's lifespan and the console's live updates
)
# --8<-- [end:console-mounted]
