"""The control plane over HTTP: the FastAPI app, token auth, the uvicorn server and a client."""
