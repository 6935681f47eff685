"""The Ray executor: a scenario's trials on a Ray cluster's workers (README "Run on a cluster")."""
