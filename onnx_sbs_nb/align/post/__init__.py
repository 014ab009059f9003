"""After a run: act on one node (details, a rerun, replay bundles, sub-models)."""
