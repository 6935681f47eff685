"""Hostile model code: importing it writes the file named by $KVBENCH_MARKER (kvbench must not import it unasked)."""

import os
from pathlib import Path

Path(os.environ.get("KVBENCH_MARKER", "kvbench-remote-code-ran")).write_text("model code ran\n")
raise ImportError("marker_config: this model's code stops here")
