"""The REST API: a Starlette/FastAPI app served by uvicorn with the executor."""
