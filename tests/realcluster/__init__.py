"""The real-control-plane suite (``pytest -m realcluster``): a package so its control plane is package-scoped,
started for its first test and stopped after its last, not kept running through the rest of the session."""
