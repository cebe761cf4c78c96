"""The REST API (CONTRACT §4): a Starlette/FastAPI app served by uvicorn with the executor."""
