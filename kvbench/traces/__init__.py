"""Request traces: a serving team's traffic as kvbench reads it (kvbench.traces.read: Mooncake, Alibaba Bailian, a
CSV or JSONL of the same columns), its block-LRU hit rates at every capacity in one pass
(kvbench.traces.simulate) and traces made to measure (kvbench.traces.synthesize)."""
