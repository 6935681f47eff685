"""Serving engines driven over HTTP (llama.cpp llama-server, vLLM, SGLang): clients, load and metrics."""
