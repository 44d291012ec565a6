"""What the emulator refuses at create, as kube-apiserver does: Job validation and object-count quota.

- Jobs (``batch/v1``): the pod-template rules of :mod:`gputask.manifests.podspec` (the ones the operator
  also checks before sending) plus one it does not check, so tests can meet a refusal the operator
  could not foresee: every volume names exactly one volume source (``spec.template.spec.volumes[0]:
  Required value: must specify a volume type``). 422 Invalid, ``Job.batch "x" is invalid: ...``.
- ResourceQuota ``spec.hard`` object counts (``count/jobs.batch``, ``count/pods`` or ``pods``) in
  the object's namespace: 403 Forbidden, ``jobs.batch "x" is forbidden: exceeded quota: q,
  requested: count/jobs.batch=1, used: count/jobs.batch=0, limited: count/jobs.batch=0``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kmock import KubernetesError, resource

from gputask.manifests.fields import REQUIRED, FieldError
from gputask.manifests.podspec import template_problems
from gputask.testing._dra import claim_problems, is_claim

RESOURCE_QUOTAS = resource("", "v1", "resourcequotas")
VOLUME_SOURCES = frozenset(
    {
        "emptyDir",
        "hostPath",
        "configMap",
        "secret",
        "persistentVolumeClaim",
        "nfs",
        "projected",
        "downwardAPI",
        "csi",
        "ephemeral",
        "iscsi",
        "fc",
        "image",
    }
)


def validation_problems(res: resource, obj: Mapping[str, Any]) -> list[FieldError]:
    """Field errors the API server's validation of this kind reports for ``obj`` (Jobs, and DRA claims and templates:
    :mod:`gputask.testing._dra`)."""
    if is_claim(res):
        return claim_problems(res, obj)
    if (res.group, res.plural) != ("batch", "jobs"):
        return []
    template = (obj.get("spec") or {}).get("template")
    problems = template_problems(template, "spec.template")
    pod = template.get("spec") if isinstance(template, Mapping) else None
    volumes = pod.get("volumes") if isinstance(pod, Mapping) else None
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if isinstance(volume, Mapping) and not VOLUME_SOURCES & set(volume):
            problems.append(FieldError(f"spec.template.spec.volumes[{i}]", REQUIRED, "must specify a volume type"))
    return problems


def quota_keys(res: resource) -> tuple[str, ...]:
    """The ResourceQuota ``hard`` keys that count objects of ``res``."""
    name = f"count/{res.plural}.{res.group}" if res.group else f"count/{res.plural}"
    return (name, "pods") if (res.group, res.plural) == ("", "pods") else (name,)


def quota_refusal(
    res: resource, namespace: str | None, name: str, quotas: list[Mapping[str, Any]], count: Callable[[], int]
) -> KubernetesError | None:
    """403 Forbidden when creating one more object of ``res`` in ``namespace`` exceeds a quota there.

    ``quotas`` are the namespace's ResourceQuota objects; ``count`` counts the live objects of ``res``.
    """
    if namespace is None:
        return None
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        for key in quota_keys(res):
            if key not in hard:
                continue
            limit, used = int(str(hard[key])), count()
            if used + 1 > limit:
                qualified = f"{res.plural}.{res.group}" if res.group else str(res.plural)
                message = (
                    f'{qualified} "{name}" is forbidden: exceeded quota: {quota["metadata"]["name"]}, requested: '
                    f"{key}=1, used: {key}={used}, limited: {key}={limit}"
                )
                return KubernetesError(
                    status=403,
                    reason="Forbidden",
                    message=message,
                    details={"name": name, "group": res.group, "kind": res.plural},
                )
    return None
