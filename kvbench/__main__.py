"""``python -m kvbench``: the same as the ``kvbench`` command (and ``python -m kvbench.cli``)."""

from kvbench.cli import app

app(prog_name="kvbench")
