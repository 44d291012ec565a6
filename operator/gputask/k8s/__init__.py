"""The Kubernetes adapter: kopf handlers, conversion, Job building, executor and loop."""
