"""HTTP front-end (FastAPI + uvicorn)."""
