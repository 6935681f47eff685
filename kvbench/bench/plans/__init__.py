"""Which trials a scenario runs, in which order: a planned sweep, a capacity search, a reuse workload, a
server run; warm-up, resume and the recording of rows."""
