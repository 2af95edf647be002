"""The quickstart's MCP app mounted inside a FastAPI application (the README's recipe).

uvicorn tests.apps.mounted_app:app
"""

from fastapi import FastAPI

from examples.quickstart.app import tasks

mcp_app = tasks.asgi_app()
app = FastAPI(lifespan=tasks.lifespan)  # a mounted app's own lifespan never runs: this one runs it


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


app.mount("/", mcp_app)  # MCP at /mcp (/healthz is the Health plugin's, on the operations port)
