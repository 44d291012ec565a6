"""The Kubernetes adapter: informers and their feeds, conversion, Job building, executor and loop (run by kopf)."""
