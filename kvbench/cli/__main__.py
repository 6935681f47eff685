"""``python -m kvbench.cli``: the same as the ``kvbench`` command."""

from kvbench.cli import app

app()
