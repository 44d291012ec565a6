"""The Helm chart lints, renders valid Kubernetes 1.30 objects, grants exactly the RBAC the code needs,
ships the CRDs unchanged, and the examples validate against the CRD schemas."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import crdschema
import helmtool
from gputask.agent.metrics import AgentMetrics
from gputask.config import Config, load_config
from gputask.core.placement import POLICIES
from gputask.k8s import rbac
from gputask.k8s.rbac import Grant
from gputask.metrics import OperatorMetrics

ROOT = helmtool.ROOT
CHART = helmtool.CHART
CI_VALUES = sorted(path.name for path in (CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = helmtool.KUBE_VERSION
SUPPORTED = [f"1.{minor}.0" for minor in range(26, 35)]  # the Kubernetes versions README.md claims
CHART_CRDS = crdschema.load_crds(CHART / "crds")
# prometheus-operator's CRD is not available offline; its one object is compared whole in a test instead.
UNVALIDATED_KINDS = {"ServiceMonitor"}
# Kueue's CRDs are not available offline either: its objects in examples/kueue/ go unvalidated here.
UNVALIDATED_GROUPS = ("kueue.x-k8s.io/",)
# The metrics named in the issue: the dashboard must chart each of them.
REQUIRED_DASHBOARD_METRICS = {
    "gputask_pending_tasks",
    "gputask_admitted_tasks",
    "gputask_queue_usage",
    "gputask_node_gpu_memory_reserved_bytes",
    "gputask_node_gpu_memory_free_bytes",
    "gputask_cluster_fragmentation_ratio",
    "gputask_scheduling_cycle_duration_seconds",
    "gputask_admission_latency_seconds",
    "gputask_preemptions_total",
    "gputask_evictions_total",
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one rendered object of ``kind`` named ``name``."""
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def inventory(objects: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every object, sorted."""
    return sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects)


def rule_grants(rules: list[dict[str, Any]]) -> frozenset[Grant]:
    """Every single permission of Kubernetes RBAC rules."""
    return frozenset(
        Grant(group, resource, verb)
        for r in rules
        for group in r.get("apiGroups", [])
        for resource in r.get("resources", [])
        for verb in r.get("verbs", [])
    )


def rbac_problems(objects: list[dict[str, Any]], *, leader_election: bool = True, webhook: bool = False) -> list[str]:
    """How the rendered roles differ from gputask.k8s.rbac: missing and extra grants; empty when equal."""
    expected = {
        ("ClusterRole", "gputask-operator"): rbac.grants(rbac.OPERATOR),
        ("ClusterRole", "gputask-agent"): rbac.grants(rbac.AGENT),
        ("ClusterRole", "gputask-edit"): rbac.grants(rbac.USER_EDIT),
        ("ClusterRole", "gputask-view"): rbac.grants(rbac.USER_VIEW),
        ("ClusterRole", "gputask-inspect"): rbac.grants(rbac.INSPECT),
    }
    if leader_election:
        expected[("Role", "gputask-operator-leader-election")] = rbac.grants(rbac.OPERATOR_LEADER_ELECTION)
    if webhook:
        expected[("ClusterRole", "gputask-operator-webhook")] = rbac.grants(rbac.OPERATOR_WEBHOOK)
    roles = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in ("Role", "ClusterRole")}
    problems = [f"{kind} {name} is not in gputask.k8s.rbac" for kind, name in sorted(roles - set(expected))]
    for (kind, name), wanted in expected.items():
        granted = rule_grants(find(objects, kind, name)["rules"])
        problems += [
            f"{kind} {name} is missing {g.group or 'core'}/{g.resource} {g.verb}" for g in sorted(wanted - granted)
        ]
        problems += [
            f"{kind} {name} grants extra {g.group or 'core'}/{g.resource} {g.verb}" for g in sorted(granted - wanted)
        ]
    return problems


# -- lint and render -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES)
def test_lint_passes_for_every_ci_values_file(helm: str, values: str) -> None:
    """`helm lint --strict` accepts the chart with each ci values file."""
    args = ["lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "--values", str(CHART / "ci" / values)]
    done = helmtool.helm_run(helm, *args, check=False)
    assert (done.returncode, "0 chart(s) failed" in done.stdout) == (0, True), done.stdout + done.stderr


def test_lint_fails_on_a_broken_template(helm: str, chart_copy: Path) -> None:
    """helm lint fails, naming the file, when a template loses its closing `end` (the check can fail)."""
    template = chart_copy / "templates" / "operator" / "serviceaccount.yaml"
    text = template.read_text()
    template.write_text(text[: text.rindex("{{- end }}")])
    done = helmtool.helm_run(helm, "lint", "--strict", str(chart_copy), check=False)
    assert (done.returncode != 0, "templates/operator/serviceaccount.yaml" in done.stdout + done.stderr) == (True, True)


def test_schema_rejects_misspelled_and_malformed_values(helm: str) -> None:
    """values.schema.json turns a misspelled key or a malformed fake-GPU spec into a render error."""
    outcomes = {
        assignment: helmtool.helm_run(helm, *helmtool.template_args(sets=[assignment]), check=False).returncode != 0
        for assignment in (
            "operator.replica=3",
            "agent.fakeGpus=two-cards",
            "config.queueing=slurm",
            "agent.fakeGpus=2x24Gi",
        )
    }
    assert outcomes == {
        "operator.replica=3": True,
        "agent.fakeGpus=two-cards": True,
        "config.queueing=slurm": True,
        "agent.fakeGpus=2x24Gi": False,
    }


def test_each_ci_configuration_renders_the_expected_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Each ci values file renders exactly its expected set of objects."""
    base = [
        ("ClusterRole", "", "gputask-agent"),
        ("ClusterRole", "", "gputask-edit"),
        ("ClusterRole", "", "gputask-inspect"),
        ("ClusterRole", "", "gputask-operator"),
        ("ClusterRole", "", "gputask-view"),
        ("ClusterRoleBinding", "", "gputask-agent"),
        ("ClusterRoleBinding", "", "gputask-operator"),
        ("ConfigMap", "gputask-system", "gputask-config"),
        ("ConfigMap", "gputask-system", "gputask-dashboard"),
        *[
            ("CustomResourceDefinition", "", name)
            for name in sorted(c["metadata"]["name"] for c in CHART_CRDS.values())
        ],
        ("DaemonSet", "gputask-system", "gputask-agent"),
        ("Deployment", "gputask-system", "gputask-operator"),
        ("PodDisruptionBudget", "gputask-system", "gputask-operator"),
        ("Role", "gputask-system", "gputask-operator-leader-election"),
        ("RoleBinding", "gputask-system", "gputask-operator-leader-election"),
        ("Service", "gputask-system", "gputask-agent-metrics"),
        ("Service", "gputask-system", "gputask-operator-metrics"),
        ("ServiceAccount", "gputask-system", "gputask-agent"),
        ("ServiceAccount", "gputask-system", "gputask-operator"),
    ]

    def variant(drop: list[tuple[str, str, str]], add: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        return sorted([o for o in base if o not in drop] + add)

    dashboard = ("ConfigMap", "gputask-system", "gputask-dashboard")
    assert {name: inventory(objects) for name, objects in rendered.items()} == {
        "default-values.yaml": sorted(base),
        "kind-fake-gpus-values.yaml": sorted(base),
        "servicemonitor-values.yaml": variant(
            [dashboard],
            [("ConfigMap", "monitoring", "gputask-dashboard"), ("ServiceMonitor", "gputask-system", "gputask")],
        ),
        "single-namespace-values.yaml": variant(
            [
                ("Role", "gputask-system", "gputask-operator-leader-election"),
                ("RoleBinding", "gputask-system", "gputask-operator-leader-election"),
            ],
            [],
        ),
        "webhook-values.yaml": variant([], [
            ("ClusterRole", "", "gputask-operator-webhook"),
            ("ClusterRoleBinding", "", "gputask-operator-webhook"),
            ("Service", "gputask-system", "gputask-webhook"),
        ]),
    }


def test_rendered_objects_are_valid_on_every_supported_kubernetes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Every built-in object (CRDs included) validates strictly against the schemas of Kubernetes 1.26 to 1.34."""
    errors = []
    for version in SUPPORTED:
        for name, objects in rendered.items():
            for obj in objects:
                where = f"{version} {name}: {obj['kind']} {obj['metadata']['name']}"
                if obj["kind"] not in UNVALIDATED_KINDS:
                    try:
                        kubernetes_validate.validate(obj, version, strict=True)
                    except kubernetes_validate.ValidationError as exc:
                        errors.append(f"{where}: {exc.message} at {list(exc.absolute_path)}")
    assert errors == []


def test_rendering_is_deterministic_and_hook_free(helm: str) -> None:
    """Two renders are identical and use no Helm hooks, so GitOps tools (Argo CD, Flux) see no drift."""
    values = [CHART / "ci" / "servicemonitor-values.yaml"]
    first, second = (helmtool.helm_run(helm, *helmtool.template_args(values)).stdout for _ in range(2))
    hooks = [line for line in first.splitlines() if "helm.sh/hook" in line]
    assert (first == second, hooks) == (True, [])


def test_notes_tell_how_to_see_queues_tasks_and_metrics(helm: str) -> None:
    """NOTES.txt shows the commands for flavors, cluster and local queues, tasks and the metrics port-forward."""
    args = ["install", "gputask", str(CHART), "--dry-run=client", "--namespace", "gputask-system"]
    notes = helmtool.helm_run(helm, *args).stdout.partition("NOTES:")[2]
    wanted = [
        "kubectl get grf,gcq",
        "kubectl get glq -A",
        "kubectl get gt -A",
        "kubectl -n gputask-system port-forward svc/gputask-operator-metrics 9400",
        "curl -s localhost:9400/metrics",
    ]
    assert [command for command in wanted if command not in notes] == []


# -- values ------------------------------------------------------------------------------------------


def values_keys(text: str) -> Iterator[tuple[tuple[str, ...], bool]]:
    """(path, documented) of every mapping key of values.yaml outside list items."""
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    list_indent: int | None = None
    for line in text.splitlines():
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        if list_indent is not None and stripped and (indent > list_indent or stripped.startswith("- ")):
            continue
        list_indent = None
        match = re.match(r"([\w./-]+):", stripped)
        if stripped.startswith("- "):
            list_indent = indent
        elif match:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            yield (*(key for _, key in stack), match.group(1)), bool(comments) and comments[0].startswith("# --")
            stack.append((indent, match.group(1)))
        comments = []


def test_every_value_is_documented_and_in_the_schema() -> None:
    """Each key of values.yaml that the chart defines has a `# --` comment and a place in values.schema.json."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    problems = []
    for path, documented in values_keys((CHART / "values.yaml").read_text()):
        parent = schema
        for key in path[:-1]:
            parent = parent.get("properties", {}).get(key, {})
        if "properties" not in parent:
            continue  # inside a free-form Kubernetes value (probe, resources...), documented as a whole
        if path[-1] not in parent["properties"]:
            problems.append(f"{'.'.join(path)}: not in values.schema.json")
        if not documented:
            problems.append(f"{'.'.join(path)}: no `# --` comment")
    assert problems == []


def test_values_file_keys_match_the_schema_both_ways() -> None:
    """values.yaml sets every key the schema defines for chart-owned sections, so no option is undocumented."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def missing(node: dict[str, Any], value: Any, path: str) -> list[str]:
        if "properties" not in node or not isinstance(value, dict):
            return []
        out = [f"{path}{key}" for key in node["properties"] if key not in value]
        for key, sub in node["properties"].items():
            out += missing(sub, value.get(key), f"{path}{key}.")
        return out

    assert missing(schema, values, "") == []


# -- configuration -----------------------------------------------------------------------------------


def rendered_config(objects: list[dict[str, Any]], tmp_path: Path) -> Config:
    """The operator configuration in the rendered ConfigMap, loaded by the operator's own loader."""
    path = tmp_path / "config.yaml"
    path.write_text(find(objects, "ConfigMap", "gputask-config")["data"]["config.yaml"])
    return load_config(path)


def test_config_map_holds_configurations_the_operator_accepts(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The ConfigMap's file loads with gputask's loader; the chart's defaults are the operator's defaults."""
    configs = {name: rendered_config(objects, tmp_path) for name, objects in rendered.items()}
    lease = {"leaseName": "gputask-operator", "leaseNamespace": "gputask-system"}
    chart_default = Config.model_validate({**lease, "leaderElection": True})
    assert configs == {
        "default-values.yaml": chart_default,
        "kind-fake-gpus-values.yaml": chart_default.model_copy(
            update={"node_failure_grace_period_s": 20.0, "heartbeat_stale_after_s": 60.0}
        ),
        "servicemonitor-values.yaml": chart_default,
        "single-namespace-values.yaml": Config.model_validate({**lease, "namespace": "ml-team"}),
        "webhook-values.yaml": chart_default,
    }


def test_chart_config_defaults_are_the_operator_defaults_but_leader_election() -> None:
    """values.yaml's config section repeats the operator's defaults, except that the chart turns leader election on."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    chart = Config.model_validate({k: v for k, v in values.items() if not k.startswith("lease") or v})
    assert chart.model_copy(update={"leader_election": False}) == Config()


def test_every_config_value_reaches_the_configuration_file(helm: str, tmp_path: Path) -> None:
    """Each config.* value set away from its default is in the rendered file as set (foreignMemoryToleranceMiB and
    queuePositionsTracked were once documented values the file left out)."""
    sets = ["config.pinning=cdi", "config.jobRuntimeClassName=nvidia-cdi", "config.foreignMemoryToleranceMiB=2048",
            "config.queuePositionsTracked=7", "config.namespace=ml", "config.policy=firstfit"]
    config = rendered_config(helmtool.render(helm, sets=sets), tmp_path).public()
    picked = {key: config[key] for key in ("pinning", "jobRuntimeClassName", "foreignMemoryToleranceMiB",
                                           "queuePositionsTracked", "namespace", "policy")}
    assert picked == {"pinning": "cdi", "jobRuntimeClassName": "nvidia-cdi", "foreignMemoryToleranceMiB": 2048,
                      "queuePositionsTracked": 7, "namespace": "ml", "policy": "firstfit"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    assert sorted(set(Config().public()) - {"apiVersion", "kind"} - set(values)) == []


def test_config_change_rolls_the_operator(helm: str) -> None:
    """A changed configuration changes the pod template's checksum, so the operator restarts and reads it."""

    def checksum(*sets: str) -> str:
        deployment = find(helmtool.render(helm, sets=sets), "Deployment", "gputask-operator")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum() != checksum("config.cycleInterval=2s")


# -- workloads ---------------------------------------------------------------------------------------


def test_operator_knows_its_pod_from_the_downward_api(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """POD_NAMESPACE (the Lease's default namespace) and POD_NAME (the pinning check's Event goes on the Pod) come
    from the downward API."""
    pod = find(rendered["default-values.yaml"], "Deployment", "gputask-operator")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("valueFrom") for e in pod["containers"][0]["env"]}
    assert (env["POD_NAMESPACE"], env["POD_NAME"]) == ({"fieldRef": {"fieldPath": "metadata.namespace"}},
                                                       {"fieldRef": {"fieldPath": "metadata.name"}})


def test_operator_runs_the_configured_command_with_probes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The operator container runs `gputask run` with config, liveness and metrics flags, probed on /healthz."""
    pod = find(rendered["default-values.yaml"], "Deployment", "gputask-operator")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    summary = {
        "image": container["image"],
        "args": container["args"],
        "ports": container["ports"],
        "liveness": container["livenessProbe"]["httpGet"],
        "readiness": container["readinessProbe"]["httpGet"],
        "mounts": container["volumeMounts"],
        "config": pod["volumes"][0],
    }
    assert summary == {
        "image": "ghcr.io/gputask/gputask:0.1.0",
        "args": [
            "run",
            "--config",
            "/etc/gputask/config.yaml",
            "--liveness",
            "http://0.0.0.0:8080/healthz",
            "--metrics-port",
            "9400",
            "--metrics-bind-address",
            "0.0.0.0",
        ],
        "ports": [
            {"name": "metrics", "containerPort": 9400, "protocol": "TCP"},
            {"name": "health", "containerPort": 8080, "protocol": "TCP"},
        ],
        "liveness": {"path": "/healthz", "port": "health"},
        "readiness": {"path": "/healthz", "port": "health"},
        "mounts": [
            {"name": "config", "mountPath": "/etc/gputask", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "config": {"name": "config", "configMap": {"name": "gputask-config"}},
    }


def test_chart_passes_only_options_the_commands_accept(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Every --option the Deployment and DaemonSet pass is one `gputask run` / `gputask agent` accepts."""
    import typer.main

    from gputask.cli import app

    commands = typer.main.get_command(app).commands
    accepted = {name: {o for p in command.params for o in p.opts} for name, command in commands.items()}
    unknown = set()
    for objects in rendered.values():
        for obj in objects:
            if obj["kind"] in ("Deployment", "DaemonSet"):
                (container,) = obj["spec"]["template"]["spec"]["containers"]
                command, *args = container["args"]
                if command not in accepted:
                    unknown.add((command, "is not a gputask command"))
                    continue
                unknown |= {(command, a) for a in args if a.startswith("--") and a not in accepted[command]}
    assert unknown == set()


def test_agent_gets_its_node_name_and_fake_gpus_on_kind(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """On kind the agent runs on the labelled workers with fake GPUs and its node name from the downward API."""
    pod = find(rendered["kind-fake-gpus-values.yaml"], "DaemonSet", "gputask-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    summary = {
        "image": (container["image"], container["imagePullPolicy"]),
        "args": container["args"],
        "node_name": container["env"][0],
        "nodeSelector": pod["nodeSelector"],
        "runtimeClassName": pod.get("runtimeClassName"),
    }
    assert summary == {
        "image": ("gputask:e2e", "Never"),
        "args": ["agent", "--node-name", "$(NODE_NAME)", "--metrics-port", "9401", "--metrics-bind-address", "0.0.0.0",
                 "--fake-gpus", "2x24Gi", "--pod-resources-socket", ""],
        "node_name": {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        "nodeSelector": {"gputask.io/fake-gpus": "true"},
        "runtimeClassName": None,
    }


def test_agent_with_a_runtime_class_sees_all_gpus_without_requesting_them(helm: str) -> None:
    """With agent.runtimeClassName the agent pod uses it and asks the NVIDIA runtime for all GPUs, no device request."""
    objects = helmtool.render(helm, sets=["agent.runtimeClassName=nvidia"])
    pod = find(objects, "DaemonSet", "gputask-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    summary = (pod["runtimeClassName"], env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"])
    assert (summary, container["resources"].get("limits", {}).get("nvidia.com/gpu")) == (
        ("nvidia", "all", "utility"),
        None,
    )


def test_pods_run_restricted(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Operator pods, and agent pods with fake GPUs, run non-root, read-only, unescalated, without capabilities or
    host access; the agent on real GPUs adds only uid 0 (for the kubelet's socket), hostPID and that socket's
    directory, read-only."""
    seen = {}
    for name, objects in rendered.items():
        for obj in objects:
            if obj["kind"] not in ("Deployment", "DaemonSet"):
                continue
            pod = obj["spec"]["template"]["spec"]
            host = sorted(k for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k))
            host += [(v["name"], v["hostPath"]["path"]) for v in pod.get("volumes", []) if "hostPath" in v]
            mounts = [(m["name"], m.get("readOnly")) for c in pod["containers"] for m in c["volumeMounts"]]
            seen[(name, obj["kind"])] = (
                pod["securityContext"]["runAsNonRoot"],
                pod["securityContext"]["seccompProfile"],
                [c["securityContext"] for c in pod["containers"]],
                host,
                mounts,
            )
    restricted = (True, {"type": "RuntimeDefault"}, [RESTRICTED_CONTAINER], [], [("tmp", None)])
    operator = (True, {"type": "RuntimeDefault"}, [RESTRICTED_CONTAINER], [], [("config", True), ("tmp", None)])
    real_agent = (
        True,
        {"type": "RuntimeDefault"},
        [RESTRICTED_CONTAINER | {"runAsUser": 0, "runAsNonRoot": False}],
        ["hostPID", ("pod-resources", "/var/lib/kubelet/pod-resources")],
        [("tmp", None), ("pod-resources", True)],
    )
    webhook_operator = (*operator[:4], [("config", True), ("tmp", None), ("webhook-tls", True)])
    expected = {
        (name, kind): (webhook_operator if name.startswith("webhook") else operator) if kind == "Deployment"
        else restricted if name.startswith("kind-fake") else real_agent
        for name, kind in seen
    }
    assert seen == expected and len(seen) == 2 * len(CI_VALUES)


def test_the_agent_reads_pod_resources_and_host_pids_by_default_and_each_can_be_turned_off(helm: str) -> None:
    """By default the agent mounts the kubelet's pod-resources directory read-only, reads its socket as uid 0 and
    runs with hostPID (--host-pid); with both values off it passes an empty socket and is restricted again."""

    def agent(*sets: str) -> tuple[Any, ...]:
        pod = find(helmtool.render(helm, sets=list(sets)), "DaemonSet", "gputask-agent")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = container["args"]
        socket = args[args.index("--pod-resources-socket") + 1]
        volumes = [v for v in pod["volumes"] if "hostPath" in v]
        return socket, "--host-pid" in args, pod.get("hostPID"), volumes, container["securityContext"].get("runAsUser")

    assert [agent(), agent("agent.podResources.enabled=false", "agent.hostPID=false"),
            agent("agent.podResources.hostPath=/var/lib/k0s/kubelet/pod-resources")] == [
        ("/var/lib/kubelet/pod-resources/kubelet.sock", True, True,
         [{"name": "pod-resources",
           "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"}}],
         0),
        ("", False, None, [], None),
        ("/var/lib/k0s/kubelet/pod-resources/kubelet.sock", True, True,
         [{"name": "pod-resources",
           "hostPath": {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "DirectoryOrCreate"}}],
         0),
    ]


# -- RBAC ----------------------------------------------------------------------------------------


def test_rbac_grants_exactly_what_the_code_needs(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The rendered ClusterRoles and Roles grant exactly the rules of gputask.k8s.rbac, no more, no less."""
    problems = {
        name: rbac_problems(objects, leader_election=not name.startswith("single-namespace"),
                            webhook=name.startswith("webhook"))
        for name, objects in rendered.items()
    }
    assert problems == {name: [] for name in rendered}


def test_more_than_one_replica_needs_leader_election(helm: str) -> None:
    """Rendering refuses several operator replicas without leader election (each would schedule)."""

    def outcome(*sets: str) -> tuple[int, bool]:
        done = helmtool.helm_run(helm, *helmtool.template_args(sets=sets), check=False)
        return done.returncode, "needs config.leaderElection: true" in done.stderr

    assert [outcome("config.leaderElection=false"), outcome("config.leaderElection=false", "operator.replicas=1")] == [
        (1, True),
        (0, False),
    ]


def test_the_webhook_is_off_by_default_and_on_is_served_through_its_service_with_the_mounted_certificate(
        helm: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """By default no webhook flag, port, Service or role. webhook.enabled: the operator serves on webhook.port and
    registers by the Service (NAMESPACE/NAME) that selects the operator pods on that port, serving the mounted
    certSecret; the role may patch only kopf's configuration gputask.io. Several replicas without certSecret (each
    would self-sign) are refused."""
    from gputask.k8s.webhook import CONFIGURATION

    def webhook_args(objects: list[dict[str, Any]]) -> list[str]:
        (container,) = find(objects, "Deployment", "gputask-operator")["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        return [a for i, a in enumerate(args) if "webhook" in a or (i and "webhook" in args[i - 1])]

    default, on = rendered["default-values.yaml"], rendered["webhook-values.yaml"]
    deployment = find(on, "Deployment", "gputask-operator")
    pod = deployment["spec"]["template"]["spec"]
    service = find(on, "Service", "gputask-webhook")
    patch_rule = next(r for r in find(on, "ClusterRole", "gputask-operator-webhook")["rules"] if "patch" in r["verbs"])
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "webhook-tls")
    refused = helmtool.helm_run(helm, *helmtool.template_args(sets=["webhook.enabled=true"]), check=False)
    single = helmtool.render(helm, sets=["webhook.enabled=true", "operator.replicas=1"])
    assert (webhook_args(default), [o["metadata"]["name"] for o in default if "webhook" in o["metadata"]["name"]]) == (
        [], [])
    assert (webhook_args(on), [p for p in pod["containers"][0]["ports"] if p["name"] == "webhook"],
            service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"],
            service["spec"]["ports"], (mount["mountPath"], mount["readOnly"]),
            next(v for v in pod["volumes"] if v["name"] == "webhook-tls")["secret"], patch_rule["resourceNames"]) == (
        ["--webhook-listen", "0.0.0.0:9443", "--webhook-service", "gputask-system/gputask-webhook",
         "--webhook-cert-dir", "/etc/gputask-webhook"],
        [{"name": "webhook", "containerPort": 9443, "protocol": "TCP"}], True,
        [{"name": "webhook", "port": 9443, "targetPort": "webhook", "protocol": "TCP"}],
        ("/etc/gputask-webhook", True), {"secretName": "gputask-webhook-tls"}, [CONFIGURATION],
    )
    assert (refused.returncode, "needs webhook.certSecret" in refused.stderr, webhook_args(single)) == (
        1, True, ["--webhook-listen", "0.0.0.0:9443", "--webhook-service", "gputask-system/gputask-webhook"])


def test_leader_election_role_is_limited_to_the_configured_lease(helm: str) -> None:
    """The Lease Role lives in the Lease's namespace and reads or renews only that Lease, the one the config names."""
    objects = helmtool.render(helm, sets=["config.leaseName=scheduler", "config.leaseNamespace=ops"])
    role = find(objects, "Role", "gputask-operator-leader-election")
    config = yaml.safe_load(find(objects, "ConfigMap", "gputask-config")["data"]["config.yaml"])
    summary = (
        role["metadata"]["namespace"],
        [r.get("resourceNames") for r in role["rules"]],
        config["leaseName"],
        config["leaseNamespace"],
    )
    assert summary == ("ops", [None, ["scheduler"]], "scheduler", "ops")


def test_rbac_check_fails_when_a_template_drops_a_verb(helm: str, chart_copy: Path) -> None:
    """A chart copy whose operator ClusterRole lost `patch` on Jobs (relabel's write) fails the RBAC check, naming
    the verb."""
    template = chart_copy / "templates" / "rbac" / "operator-clusterrole.yaml"
    text = template.read_text()
    assert "verbs: [get, list, watch, create, patch, delete]" in text
    template.write_text(text.replace("verbs: [get, list, watch, create, patch, delete]",
                                     "verbs: [get, list, watch, create, delete]"))
    assert rbac_problems(helmtool.render(helm, chart=chart_copy)) == [
        "ClusterRole gputask-operator is missing batch/jobs patch"
    ]


def test_rbac_check_fails_on_an_extra_grant(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """A ClusterRole that grants more than the table (here: secrets) fails the least-privilege check."""
    objects = copy.deepcopy(rendered["default-values.yaml"])
    find(objects, "ClusterRole", "gputask-agent")["rules"].append(
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    )
    assert rbac_problems(objects) == ["ClusterRole gputask-agent grants extra core/secrets get"]


def test_rbac_binds_each_role_to_its_service_account(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The operator's and the agent's roles are bound to their own ServiceAccounts, which their pods use."""
    objects = rendered["default-values.yaml"]
    bindings = {
        b["roleRef"]["name"]: [(s["kind"], s["namespace"], s["name"]) for s in b["subjects"]]
        for b in objects
        if b["kind"] == "ClusterRoleBinding"
    }
    accounts = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["serviceAccountName"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    assert (bindings, accounts) == (
        {
            "gputask-operator": [("ServiceAccount", "gputask-system", "gputask-operator")],
            "gputask-agent": [("ServiceAccount", "gputask-system", "gputask-agent")],
        },
        {"gputask-operator": "gputask-operator", "gputask-agent": "gputask-agent"},
    )


# -- monitoring ----------------------------------------------------------------------------------


def test_service_monitor_scrapes_both_metrics_services_only_when_enabled(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The ServiceMonitor exists only with monitoring.serviceMonitor.enabled and selects the two metrics Services."""
    monitors = {name: [o for o in objects if o["kind"] == "ServiceMonitor"] for name, objects in rendered.items()}
    services = [
        (
            s["metadata"]["name"],
            s["metadata"]["labels"]["gputask.io/metrics"],
            s["spec"]["ports"][0]["name"],
            s["spec"]["ports"][0]["port"],
        )
        for s in rendered["servicemonitor-values.yaml"]
        if s["kind"] == "Service"
    ]
    monitor = monitors.pop("servicemonitor-values.yaml")[0]
    monitor["metadata"]["labels"] = {"release": monitor["metadata"]["labels"]["release"]}
    assert (monitors, sorted(services), monitor) == (
        {name: [] for name in monitors},
        [("gputask-agent-metrics", "true", "metrics", 9401), ("gputask-operator-metrics", "true", "metrics", 9400)],
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "gputask", "namespace": "gputask-system", "labels": {"release": "prometheus"}},
            "spec": {
                "namespaceSelector": {"matchNames": ["gputask-system"]},
                "selector": {"matchLabels": {"app.kubernetes.io/instance": "gputask", "gputask.io/metrics": "true"}},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}],
            },
        },
    )


def test_dashboard_config_map_carries_the_dashboard_with_every_metric(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The dashboard ConfigMap has the sidecar label and the dashboard, which charts exactly the operator's and
    the agent's metrics."""
    config_map = find(rendered["default-values.yaml"], "ConfigMap", "gputask-dashboard")
    dashboard = json.loads(config_map["data"]["gputask.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    metrics = {re.sub(r"_bucket$", "", m) for e in exprs for m in re.findall(r"\bgputask_[a-z_]+", e)}
    summary = (
        config_map["metadata"]["labels"]["grafana_dashboard"],
        dashboard == json.loads((CHART / "dashboards" / "gputask.json").read_text()),
        metrics >= REQUIRED_DASHBOARD_METRICS,
        metrics,
    )
    assert summary == ("1", True, True, operator_metric_names() | agent_metric_names())


def operator_metric_names() -> set[str]:
    """The names of the metrics the operator exports (counters with their _total suffix)."""
    families = OperatorMetrics().registry.collect()
    return {f.name + ("_total" if f.type == "counter" else "") for f in families}


def agent_metric_names() -> set[str]:
    """The names of the metrics the node agent exports (the dashboard charts its per-GPU series too)."""
    families = AgentMetrics("node").registry.collect()
    return {f.name + ("_total" if f.type == "counter" else "") for f in families}


# -- CRDs and examples ---------------------------------------------------------------------------


def test_chart_crds_are_byte_identical_copies_of_the_source_crds() -> None:
    """charts/gputask/crds/ holds exactly crds/*.yaml, byte for byte (copy crds/ after editing it)."""
    source = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    assert chart == source


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    """(path under examples/, object) of every document in examples/, subfolders included, except
    examples/scenarios/ (scenario files for ``gputask scenario run``, not Kubernetes objects)."""
    return [
        (str(path.relative_to(ROOT / "examples")), doc)
        for path in sorted((ROOT / "examples").rglob("*.yaml"))
        if path.parent.name != "scenarios"
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def test_examples_validate_against_the_crds_and_kubernetes_schemas() -> None:
    """Each custom resource in examples/ validates against its CRD, each built-in object against Kubernetes 1.30."""
    validators = {kind: crdschema.validator_for(crd) for kind, crd in crdschema.load_crds(ROOT / "crds").items()}
    errors = []
    for name, obj in example_documents():
        where = f"{name}: {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        if obj.get("apiVersion", "").startswith("gputask.io/"):
            errors += [f"{where}: {e.message}" for e in validators[obj["kind"]].iter_errors(obj)]
            continue
        if obj.get("apiVersion", "").startswith(UNVALIDATED_GROUPS):
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {exc.message}")
    assert (errors, len(example_documents()) > 0) == ([], True)


def test_gitops_examples_carry_no_status() -> None:
    """GPUTask and GPUClusterQueue examples set no status: the operator writes it, re-applying them never fights it."""
    with_status = [
        f"{name}: {obj['kind']} {obj['metadata']['name']}"
        for name, obj in example_documents()
        if obj.get("kind") in ("GPUTask", "GPUClusterQueue") and "status" in obj
    ]
    assert with_status == []


def test_user_roles_aggregate_into_admin_edit_and_view(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Namespace users bound to admin or edit manage GPUTasks and GPULocalQueues, view reads them (Kubernetes'
    aggregation labels); the cluster-scoped queues and flavors are not aggregated."""
    objects = rendered["default-values.yaml"]
    labels = {name: sorted(k for k in find(objects, "ClusterRole", name)["metadata"]["labels"]
                           if k.startswith("rbac.authorization.k8s.io/"))
              for name in ("gputask-edit", "gputask-view")}
    resources = {r for name in ("gputask-edit", "gputask-view")
                 for rule in find(objects, "ClusterRole", name)["rules"] for r in rule["resources"]}
    assert (labels, sorted(resources)) == (
        {"gputask-edit": ["rbac.authorization.k8s.io/aggregate-to-admin",
                          "rbac.authorization.k8s.io/aggregate-to-edit"],
         "gputask-view": ["rbac.authorization.k8s.io/aggregate-to-view"]},
        ["gpulocalqueues", "gpulocalqueues/status", "gputasks", "gputasks/status"],
    )


def test_operator_pod_disruption_budget_selects_the_operator_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The PodDisruptionBudget lets a drain take one operator pod at a time, and selects exactly the
    Deployment's pods."""
    objects = rendered["default-values.yaml"]
    pdb = find(objects, "PodDisruptionBudget", "gputask-operator")
    deployment = find(objects, "Deployment", "gputask-operator")
    assert (pdb["apiVersion"], pdb["spec"]["maxUnavailable"], pdb["spec"]["selector"]) == (
        "policy/v1", 1, deployment["spec"]["selector"],
    )


def test_schema_refuses_unknown_policies_and_takes_every_configuration_key(helm: str) -> None:
    """`--set config.policy=bogus` fails at install; every key of the operator's Configuration is a
    config value of the chart, and the policy enum is the operator's policy list."""
    args = helmtool.template_args(sets=["config.policy=bogus"])
    refused = helmtool.helm_run(helm, *args, check=False)
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]["properties"]
    aliases = {f.alias or name for name, f in Config.model_fields.items()} - {"apiVersion", "kind"}
    assert (refused.returncode != 0, "/config/policy" in refused.stderr, set(schema), schema["policy"]["enum"]) == (
        True, True, aliases, sorted(POLICIES),
    )


def test_the_license_file_is_the_license_pyproject_declares() -> None:
    """LICENSE holds the Apache License 2.0 text that pyproject.toml's SPDX id names, and the chart says so too."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    text = (ROOT / "LICENSE").read_text()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    license_annotation = chart["annotations"]["artifacthub.io/license"]
    assert (declared, text.split()[:4], "END OF TERMS AND CONDITIONS" in text, license_annotation) == (
        "Apache-2.0", ["Apache", "License", "Version", "2.0,"], True, "Apache-2.0",
    )


def test_agent_uses_the_gpu_operators_runtime_class_by_default_and_notes_warn_when_it_is_missing(helm: str) -> None:
    """By default the agent pod runs with RuntimeClass nvidia (the GPU Operator's) and asks it for every GPU;
    with fake GPUs it needs none; an install that cannot find the RuntimeClass says what to set in its NOTES."""
    pod = find(helmtool.render(helm), "DaemonSet", "gputask-agent")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    fake = find(helmtool.render(helm, sets=["agent.fakeGpus=1x8Gi"]), "DaemonSet", "gputask-agent")
    fake_env = {e["name"] for e in fake["spec"]["template"]["spec"]["containers"][0]["env"]}
    args = ["install", "gputask", str(CHART), "--dry-run=client", "--namespace", "gputask-system"]
    notes = helmtool.helm_run(helm, *args).stdout.partition("NOTES:")[2]
    quiet = helmtool.helm_run(helm, *args, "--set", "agent.runtimeClassName=").stdout.partition("NOTES:")[2]
    assert (pod.get("runtimeClassName"), env.get("NVIDIA_VISIBLE_DEVICES"),
            fake["spec"]["template"]["spec"].get("runtimeClassName"), "NVIDIA_VISIBLE_DEVICES" in fake_env,
            'RuntimeClass "nvidia" was not found' in notes, "--set agent.runtimeClassName=<name>" in notes,
            "RuntimeClass" in quiet) == ("nvidia", "all", None, False, True, True, False)


def test_schema_refuses_dra_pinning_with_kueue_queueing_as_the_operator_does(helm: str) -> None:
    """config.pinning=dra with config.queueing=kueue fails at install (the operator would exit 2 at start and
    crash-loop); cdi with kueue, and dra alone, render."""
    def refused(*sets: str) -> bool:
        return helmtool.helm_run(helm, *helmtool.template_args(sets=list(sets)), check=False).returncode != 0

    dra, cdi, kueue = "config.pinning=dra", "config.pinning=cdi", "config.queueing=kueue"
    assert [refused(dra, kueue), refused(cdi, kueue), refused(dra)] == [True, False, False]
