"""The MCP app inside your own FastAPI (or Starlette) application (docs/production.md).

uvicorn examples.guide.mounted:app
"""

# --8<-- [start:mounted]
from fastapi import FastAPI

from examples.guide.tools import tasks

mcp_app = tasks.asgi_app()
app = FastAPI(lifespan=tasks.lifespan)  # a mounted app's own lifespan never runs: this one runs it


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


app.mount("/", mcp_app)  # MCP at /mcp; the plugins' routes stay apart (tasks.ops_app())
# --8<-- [end:mounted]
