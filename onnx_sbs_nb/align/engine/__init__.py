"""Running the two sides node by node: the loop (a scheduler), the sides, the plan of
which values to keep, the runners, stretches, size limits, caches and the run's options."""
