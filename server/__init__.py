"""The server of `run-agent serve`: Starlette app, change hub, SSE streams, static page."""
