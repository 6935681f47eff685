"""What is sampled around trials: NVML and psutil samplers, the machine's load and its probes."""
