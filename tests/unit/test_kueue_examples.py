"""The Kueue and device-pinning-guard manifests in examples/ are valid and say what the code does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

import crdschema
from gputask.k8s.kueue_api import CHECK_NAME, CONTROLLER_NAME

ROOT = Path(__file__).resolve().parents[2]


def documents(relative: str) -> list[dict[str, Any]]:
    """The objects of one YAML file under examples/."""
    return [d for d in yaml.safe_load_all((ROOT / "examples" / relative).read_text()) if d]


def test_examples_validate_against_the_crds_and_kubernetes_1_30() -> None:
    """gputask objects validate against crds/, built-in objects against Kubernetes 1.30; Kueue's are v1beta2."""
    validators = {kind: crdschema.validator_for(crd) for kind, crd in crdschema.load_crds(ROOT / "crds").items()}
    errors, kueue_versions = [], set()
    for name in ("kueue/gputask-mode.yaml", "kueue/kueue-mode.yaml", "policies/deny-unmanaged-visible-devices.yaml"):
        for obj in documents(name):
            if obj["apiVersion"].startswith("gputask.io/"):
                errors += [f"{name}: {e.message}" for e in validators[obj["kind"]].iter_errors(obj)]
            elif obj["apiVersion"].startswith("kueue.x-k8s.io/"):
                kueue_versions.add(obj["apiVersion"])
            else:
                kubernetes_validate.validate(obj, "1.30", strict=True)
    assert (errors, kueue_versions) == ([], {"kueue.x-k8s.io/v1beta2"})


def test_kueue_mode_example_wires_the_check_gputask_answers() -> None:
    """The ClusterQueue requires the AdmissionCheck gputask registers, and the task names the LocalQueue."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in documents("kueue/kueue-mode.yaml")}
    queue = objects[("ClusterQueue", "gpu-cluster-queue")]["spec"]
    assert (
        queue["admissionChecksStrategy"]["admissionChecks"],
        objects[("AdmissionCheck", CHECK_NAME)]["spec"],
        objects[("GPUTask", "finetune")]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
        objects[("LocalQueue", "team-a")]["spec"],
    ) == ([{"name": CHECK_NAME}], {"controllerName": CONTROLLER_NAME}, "team-a", {"clusterQueue": "gpu-cluster-queue"})


def test_guard_binding_denies_with_the_policy_and_exempts_system_namespaces() -> None:
    """The binding denies through the policy; gputask's own pods (label gputask.io/task) are not matched."""
    policy, binding = documents("policies/deny-unmanaged-visible-devices.yaml")
    assert (
        binding["spec"]["policyName"],
        binding["spec"]["validationActions"],
        binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"],
        policy["spec"]["matchConditions"][0]["expression"],
    ) == (
        policy["metadata"]["name"],
        ["Deny"],
        ["kube-system", "gpu-operator", "gputask-system"],
        "!has(object.metadata.labels) || !('gputask.io/task' in object.metadata.labels)",
    )
