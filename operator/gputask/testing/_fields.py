"""Unknown fields of custom resources, pruned and reported as kube-apiserver does (field validation).

kube-apiserver prunes every field a CRD's structural schema does not declare (apiextensions-apiserver's
``pruning.go``) and, by the request's ``fieldValidation`` parameter, says so:

- ``Strict`` (kubectl's default for create, apply and replace): the write is refused. A create or a PUT
  gets 400 BadRequest ``GPUTask in version "v1alpha1" cannot be handled as a GPUTask: strict decoding
  error: unknown field "spec.gpuMemroy"``; a merge or JSON patch 422 Invalid ``... is invalid: patch:
  Invalid value: "<patched object>": strict decoding error: ...``.
- ``Warn`` (the server's default when the parameter is absent): stored pruned, one ``Warning: 299 -
  "unknown field \\"spec.gpuMemroy\\""`` response header per field.
- ``Ignore``: stored pruned, nothing said.

Pruning itself is :func:`gputask.manifests.unknown_fields.prune`. Built-in kinds are not checked here (the
emulator has no schemas for them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kmock import KubernetesError

from gputask.manifests.unknown_fields import prune
from gputask.testing._store import bad_request

STRICT, WARN, IGNORE = "Strict", "Warn", "Ignore"
__all__ = ["IGNORE", "STRICT", "WARN", "directive", "prune", "warnings"]


def directive(params: Mapping[str, str]) -> str:
    """The request's field validation (Strict, Warn or Ignore; Warn when absent).

    Raises KubernetesError (400) for any other value, as the API server does."""
    value = params.get("fieldValidation") or WARN
    if value not in (STRICT, WARN, IGNORE):
        raise bad_request(f"fieldValidation must be one of Ignore, Warn or Strict, got {value!r}")
    return value


def warnings(fields: list[str]) -> list[str]:
    """The ``Warning`` header values for these unknown fields (RFC 7234 form, code 299)."""
    return ["299 - " + json.dumps(f'unknown field "{field}"') for field in fields]


def strict_error(fields: list[str]) -> str:
    """``strict decoding error: unknown field "a", unknown field "b"``."""
    return "strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in fields)


def create_refusal(kind: str, version: str, fields: list[str]) -> KubernetesError:
    """The 400 a create or a PUT with unknown fields gets under Strict."""
    return bad_request(f'{kind} in version "{version}" cannot be handled as a {kind}: {strict_error(fields)}')


def patch_refusal(patched: Mapping[str, Any], fields: list[str]) -> KubernetesError:
    """The 422 a merge or JSON patch leaving unknown fields gets under Strict (the server names no kind or
    object in it: ``"" is invalid``)."""
    value = json.dumps(patched, separators=(",", ":"), sort_keys=True)
    message = f"Invalid value: {json.dumps(value)}: {strict_error(fields)}"
    causes = [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]
    return KubernetesError(status=422, reason="Invalid", message=f' "" is invalid: patch: {message}',
                           details={"causes": causes})


def apply_refusal(name: str, group_version: str, kind: str, fields: list[str]) -> KubernetesError:
    """The 500 a server-side apply naming an unknown field gets under Strict (structured-merge-diff's
    ``field not declared in schema``, first field only)."""
    message = f"failed to create typed patch object (/{name}; {group_version}, Kind={kind}): .{fields[0]}: " \
        "field not declared in schema"
    return KubernetesError(status=500, reason="InternalError", message=message)
