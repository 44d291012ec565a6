"""What the Job API refuses in a pod template, known before any Job is sent.

A GPUTask's ``spec.template`` becomes the pod template of a ``batch/v1`` Job. The API server
refuses a Job (422 Invalid) whose template breaks the Pod and Job validation of
``k8s.io/kubernetes/pkg/apis/core/validation`` and ``.../batch/validation``; the rules that can
be checked on the template alone are checked here, worded and addressed as the server words
them, so such a task goes ``Failed`` (InvalidSpec) at once instead of sending Jobs that are
refused, and so :func:`gputask.k8s.jobs.build_job` never meets a shape it cannot handle:

- ``restartPolicy``: Never or OnFailure (a Job's pods must end; the operator sets Never if unset);
- ``containers`` (one at least) and ``initContainers``: objects with a DNS-1123 label ``name``
  unique in the pod, an ``image``, ``command``/``args`` as lists of strings, ``env`` entries with a
  valid name, ``resources`` limits and requests that are quantities (requests at most limits),
  ``ports`` with a containerPort in 1..65535, ``volumeMounts`` that name a declared volume;
- ``volumes`` with unique DNS-1123 label names; ``nodeSelector`` a map of strings; ``affinity``,
  ``tolerations`` of the right shapes.

Not checked (the server still refuses them, and the task then says ``JobRejected`` with the
server's message): volume sources, security contexts, probes and everything else of a PodSpec.
Errors: none raised; :func:`template_problems` returns the list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gputask.manifests.fields import DUPLICATE, INVALID, NOT_FOUND, REQUIRED, FieldError, kube_quantity, not_supported

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
ENV_MESSAGE = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and "
    "must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for "
    "validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
)
RESTART_POLICIES = ("OnFailure", "Never")


def template_problems(template: Any, path: str = "spec.template") -> list[FieldError]:
    """What the Job API would refuse in ``template`` (a PodTemplateSpec dict), as the server says it."""
    if not isinstance(template, Mapping):
        return [FieldError(path, INVALID, "must be an object", template)]
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return [FieldError(f"{path}.spec", REQUIRED, "a pod template needs a spec with containers")]
    return _pod_problems(spec, f"{path}.spec")


def _pod_problems(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    out: list[FieldError] = []
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        out.append(not_supported(f"{path}.restartPolicy", policy, RESTART_POLICIES))
    volumes = _volume_names(spec.get("volumes"), f"{path}.volumes", out)
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        out.append(FieldError(f"{path}.containers", REQUIRED))
        containers = []
    init = spec.get("initContainers") or []
    if not isinstance(init, list):
        out.append(FieldError(f"{path}.initContainers", INVALID, "must be a list", init))
        init = []
    seen: set[str] = set()
    for kind, items in (("initContainers", init), ("containers", containers)):
        for i, container in enumerate(items):
            out += _container_problems(container, f"{path}.{kind}[{i}]", seen, volumes)
    out += _scheduling_problems(spec, path)
    return out


def _volume_names(volumes: Any, path: str, out: list[FieldError]) -> set[str]:
    if volumes is None:
        return set()
    if not isinstance(volumes, list):
        out.append(FieldError(path, INVALID, "must be a list", volumes))
        return set()
    names: set[str] = set()
    for i, volume in enumerate(volumes):
        name = volume.get("name") if isinstance(volume, Mapping) else None
        if not isinstance(name, str) or not name:
            out.append(FieldError(f"{path}[{i}].name", REQUIRED))
        elif not DNS1123_LABEL.fullmatch(name) or len(name) > 63:
            out.append(FieldError(f"{path}[{i}].name", INVALID, LABEL_MESSAGE, name))
        elif name in names:
            out.append(FieldError(f"{path}[{i}].name", DUPLICATE, value=name))
        else:
            names.add(name)
    return names


def _container_problems(container: Any, path: str, seen: set[str], volumes: set[str]) -> list[FieldError]:
    if not isinstance(container, Mapping):
        return [FieldError(path, INVALID, "must be an object", container)]
    out: list[FieldError] = []
    name = container.get("name")
    if not isinstance(name, str) or not name:
        out.append(FieldError(f"{path}.name", REQUIRED))
    elif not DNS1123_LABEL.fullmatch(name) or len(name) > 63:
        out.append(FieldError(f"{path}.name", INVALID, LABEL_MESSAGE, name))
    elif name in seen:
        out.append(FieldError(f"{path}.name", DUPLICATE, value=name))
    else:
        seen.add(name)
    if not isinstance(container.get("image"), str) or not container["image"].strip():
        out.append(FieldError(f"{path}.image", REQUIRED))
    for key in ("command", "args"):
        value = container.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            out.append(FieldError(f"{path}.{key}", INVALID, "must be a list of strings", value))
    out += _env_problems(container.get("env"), f"{path}.env")
    out += _resource_problems(container.get("resources"), f"{path}.resources")
    out += _port_problems(container.get("ports"), f"{path}.ports")
    out += _mount_problems(container.get("volumeMounts"), f"{path}.volumeMounts", volumes)
    return out


def _entries(value: Any, path: str, out: list[FieldError]) -> list[tuple[str, Mapping[str, Any]]]:
    """(path, entry) of a list of objects; a malformed list or entry is reported in ``out``."""
    if value is None:
        return []
    if not isinstance(value, list):
        out.append(FieldError(path, INVALID, "must be a list", value))
        return []
    found = []
    for i, entry in enumerate(value):
        if isinstance(entry, Mapping):
            found.append((f"{path}[{i}]", entry))
        else:
            out.append(FieldError(f"{path}[{i}]", INVALID, "must be an object", entry))
    return found


def _env_problems(env: Any, path: str) -> list[FieldError]:
    out: list[FieldError] = []
    for where, entry in _entries(env, path, out):
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            out.append(FieldError(f"{where}.name", REQUIRED))
        elif not ENV_NAME.fullmatch(name):
            out.append(FieldError(f"{where}.name", INVALID, ENV_MESSAGE, name))
        if entry.get("value") is not None and not isinstance(entry["value"], str):
            out.append(FieldError(f"{where}.value", INVALID, "must be a string", entry["value"]))
        if entry.get("valueFrom") is not None and not isinstance(entry["valueFrom"], Mapping):
            out.append(FieldError(f"{where}.valueFrom", INVALID, "must be an object", entry["valueFrom"]))
    return out


def _resource_problems(resources: Any, path: str) -> list[FieldError]:
    if resources is None:
        return []
    if not isinstance(resources, Mapping):
        return [FieldError(path, INVALID, "must be an object", resources)]
    out: list[FieldError] = []
    parsed: dict[str, dict[str, Decimal]] = {}
    for section in ("limits", "requests"):
        values = resources.get(section)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            out.append(FieldError(f"{path}.{section}", INVALID, "must be a map of quantities", values))
            continue
        for name, value in values.items():
            amount = _quantity(value)
            if amount is None or amount < 0:
                out.append(FieldError(f"{path}.{section}[{name}]", INVALID, "must be a non-negative quantity", value))
            else:
                parsed.setdefault(section, {})[str(name)] = amount
    for name, request in parsed.get("requests", {}).items():
        limit = parsed.get("limits", {}).get(name)
        if limit is not None and request > limit:
            out.append(FieldError(f"{path}.requests[{name}]", INVALID, f"must be less than or equal to {name} limit",
                                  resources["requests"][name]))  # fmt: skip
    return out


def _quantity(value: Any) -> Decimal | None:
    try:
        return kube_quantity(value)
    except ValueError:
        return None


def _port_problems(ports: Any, path: str) -> list[FieldError]:
    out: list[FieldError] = []
    for where, port in _entries(ports, path, out):
        number = port.get("containerPort")
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            out.append(FieldError(f"{where}.containerPort", INVALID, "must be between 1 and 65535, inclusive", number))
    return out


def _mount_problems(mounts: Any, path: str, volumes: set[str]) -> list[FieldError]:
    out: list[FieldError] = []
    for where, mount in _entries(mounts, path, out):
        name = mount.get("name")
        if not isinstance(name, str) or not name:
            out.append(FieldError(f"{where}.name", REQUIRED))
        elif name not in volumes:
            out.append(FieldError(f"{where}.name", NOT_FOUND, value=name))
        if not isinstance(mount.get("mountPath"), str) or not mount["mountPath"]:
            out.append(FieldError(f"{where}.mountPath", REQUIRED))
    return out


def _scheduling_problems(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    out: list[FieldError] = []
    selector = spec.get("nodeSelector")
    if selector is not None and (
        not isinstance(selector, Mapping) or not all(isinstance(v, str) for v in selector.values())
    ):
        out.append(FieldError(f"{path}.nodeSelector", INVALID, "must be a map of strings", selector))
    affinity = spec.get("affinity")
    if affinity is not None and not isinstance(affinity, Mapping):
        out.append(FieldError(f"{path}.affinity", INVALID, "must be an object", affinity))
    elif isinstance(affinity, Mapping):
        out += _node_affinity_problems(affinity.get("nodeAffinity"), f"{path}.affinity.nodeAffinity")
    _entries(spec.get("tolerations"), f"{path}.tolerations", out)
    return out


def _node_affinity_problems(node_affinity: Any, path: str) -> list[FieldError]:
    if node_affinity is None:
        return []
    if not isinstance(node_affinity, Mapping):
        return [FieldError(path, INVALID, "must be an object", node_affinity)]
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    if required is None:
        return []
    if not isinstance(required, Mapping):
        return [FieldError(path, INVALID, "must be an object", required)]
    out: list[FieldError] = []
    for where, term in _entries(required.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms", out):
        _entries(term.get("matchExpressions"), f"{where}.matchExpressions", out)
        _entries(term.get("matchFields"), f"{where}.matchFields", out)
    return out
