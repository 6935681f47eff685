"""``kvbench report`` and ``kvbench cost`` as a library: cell formatting (:mod:`~kvbench.report.format`), the tables
as text (:mod:`~kvbench.report.tables`), advice text (:mod:`~kvbench.report.advice`), charts
(:mod:`~kvbench.report.charts`), the Markdown and HTML documents (:mod:`~kvbench.report.documents`) and their
writer (:mod:`~kvbench.report.write`), cost files (:mod:`~kvbench.report.cost`), compare's table
(:mod:`~kvbench.report.compare`), plan's (:mod:`~kvbench.report.plan`) and the GPU checks' file
(:mod:`~kvbench.report.gpu_checks`). Reading code: it never imports :mod:`kvbench.bench`."""
