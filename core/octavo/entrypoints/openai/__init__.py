"""The OpenAI-compatible HTTP server (FastAPI): ``octavo serve``. Imports the engine."""
