"""The chart's optional device-pinning guard renders the same policy as the plain example manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

import helmtool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "policies" / "deny-unmanaged-visible-devices.yaml"
GUARD_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def guard(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered policy objects."""
    return [o for o in objects if o["kind"] in GUARD_KINDS]


def test_guard_is_off_by_default(helm: str) -> None:
    """Without devicePinningGuard.enabled the chart renders no admission policy."""
    assert guard(helmtool.render(helm)) == []


def test_guard_renders_the_example_policy_exempting_the_release_namespace(helm: str) -> None:
    """Enabled, the chart renders the example's valid policy and binding, exempting the release namespace."""
    policy, binding = guard(helmtool.render(helm, sets=["devicePinningGuard.enabled=true"]))
    example_policy, example_binding = yaml.safe_load_all(EXAMPLE.read_text())
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, helmtool.KUBE_VERSION, strict=True)
    assert (policy["spec"], binding["spec"]["policyName"], binding["spec"]["matchResources"]) == (
        example_policy["spec"],
        "gputask-deny-unmanaged-visible-devices",
        {
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["kube-system", "gpu-operator", "gputask-system"],
                    }
                ]
            }
        },
    )
    assert binding["spec"]["validationActions"] == example_binding["spec"]["validationActions"]
