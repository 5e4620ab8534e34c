"""The HTTP API: the FastAPI app, auth, OpenAI's objects and errors, uploads, idempotency, the routes."""
