"""The server engines: a server per mode started (or reached), its requests streamed, its
``/metrics`` read."""
