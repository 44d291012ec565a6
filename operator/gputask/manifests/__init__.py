"""Kubernetes objects (plain dicts) to core values and back, with the API server's wording of errors.

Shared by the operator (:mod:`gputask.k8s`), the scenario runner and the trace replay
(:mod:`gputask.sim`), and the emulator (:mod:`gputask.testing`), so that none of them imports
another's code: :mod:`~gputask.manifests.convert` (GPUTask, GPUClusterQueue and GPUNode to core
values), :mod:`~gputask.manifests.flavors` (GPUResourceFlavors and resource groups),
:mod:`~gputask.manifests.podspec` (what the Job API refuses in a pod template) and
:mod:`~gputask.manifests.fields` (field errors as the API server words them). No I/O.
"""
