"""Where trials run: in this process (:mod:`~kvbench.bench.executors.local`) or on a Ray cluster's
workers (:mod:`~kvbench.bench.executors.ray`). An executor places the work; it never re-decides the plan."""
