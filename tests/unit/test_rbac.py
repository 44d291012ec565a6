"""The RBAC tables in gputask.k8s.rbac cover every API call the operator and the agent make."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from gputask.config import Config
from gputask.core import GpuRequest, GpuSlot, NodeName, Placement
from gputask.k8s import client as client_module
from gputask.k8s import rbac
from gputask.k8s.client import KubeClient, Resource
from gputask.k8s.handlers import REBUILD_ORDER, Operator
from gputask.k8s.pinner import Pinner
from gputask.k8s.rbac import Grant
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics
from gputask.testing.fake import FakeKubeClient

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "gputask"
# KubeClient method -> Kubernetes verb.
CLIENT_VERBS = {
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
RESOURCES = {name: value for name, value in vars(client_module).items() if isinstance(value, Resource)}


def client_calls(source: str) -> set[Grant]:
    """Grants needed by ``<something>.client.<verb>(RESOURCE, ...)`` calls whose resource is a client.py constant."""
    needed = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        on_client = (isinstance(receiver, ast.Attribute) and receiver.attr == "client") or (
            isinstance(receiver, ast.Name) and receiver.id == "client"
        )
        if not on_client or node.func.attr not in CLIENT_VERBS or not node.args:
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Name) and first.id in RESOURCES):
            continue  # a variable resource (handlers' rebuild loop) is covered by test_rebuild_lists_are_granted
        res = RESOURCES[first.id]
        status = any(k.arg == "status" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
        needed.add(Grant(res.group, f"{res.plural}/status" if status else res.plural, CLIENT_VERBS[node.func.attr]))
    return needed


def package_calls(subpackage: str) -> set[Grant]:
    """Grants needed by every module of ``gputask.<subpackage>``."""
    return set().union(*(client_calls(path.read_text()) for path in sorted((PACKAGE / subpackage).glob("*.py"))))


def test_client_call_scanner_reads_verb_resource_and_status_subresource() -> None:
    """The scanner maps each KubeClient call on a client.py constant to its (group, resource, verb)."""
    source = (
        "async def f(self, client, resource):\n"
        "    await self.client.create(JOBS, body, ns)\n"
        "    await client.patch(GPUTASKS, name, body, ns, status=True)\n"
        "    await self.client.get(NODES, name)\n"
        "    await self.client.replace(LEASES, name, body, ns)\n"
        "    await self.client.list(resource)\n"
        "    await other.create(EVENTS, body)\n"
    )
    assert client_calls(source) == {
        Grant("batch", "jobs", "create"),
        Grant("gputask.io", "gputasks/status", "patch"),
        Grant("", "nodes", "get"),
        Grant("coordination.k8s.io", "leases", "update"),
    }


def test_every_operator_api_call_is_granted() -> None:
    """Each client call in gputask.k8s has a rule in rbac.OPERATOR or the leader-election Role."""
    granted = rbac.grants(rbac.OPERATOR) | rbac.grants(rbac.OPERATOR_LEADER_ELECTION)
    assert package_calls("k8s") - granted == set()


def test_leader_election_role_is_exactly_what_the_elector_calls() -> None:
    """The leader-election Role grants exactly the Lease calls of gputask.k8s.leader."""
    assert rbac.grants(rbac.OPERATOR_LEADER_ELECTION) == client_calls((PACKAGE / "k8s" / "leader.py").read_text())


def test_every_agent_api_call_is_granted() -> None:
    """Each client call in gputask.agent has a rule in rbac.AGENT."""
    assert package_calls("agent") - rbac.grants(rbac.AGENT) == set()


def test_agent_rules_are_exactly_what_its_code_calls() -> None:
    """rbac.AGENT grants nothing the agent's code never asks for (least privilege)."""
    assert rbac.grants(rbac.AGENT) == package_calls("agent")


def test_every_resource_the_operator_watches_is_granted_list_and_watch() -> None:
    """Each resource the operator's kopf registry or its own informers watch is granted list and watch."""
    operator = Operator(Config(), KubeClient(k8s_client.ApiClient()))
    watched = {
        (handler.selector.group or "", handler.selector.plural or handler.selector.any_name)
        for handler in operator.registry._watching.get_all_handlers()  # kopf has no public accessor
    } | {(informer.resource.group, informer.resource.plural) for informer in operator.informers.values()}
    needed = {Grant(group, plural, verb) for group, plural in watched for verb in ("list", "watch")}
    assert needed - rbac.grants(rbac.OPERATOR) == set()


def test_rebuild_lists_are_granted() -> None:
    """Each resource the operator lists at start to rebuild its state is granted list."""
    needed = {Grant(res.group, res.plural, "list") for res, _labels in REBUILD_ORDER.values()}
    assert needed - rbac.grants(rbac.OPERATOR) == set()


def test_operator_writes_only_status_of_its_custom_resources() -> None:
    """The operator never writes a GPUTask's, GPUClusterQueue's or GPULocalQueue's spec (GitOps owns it) nor a
    GPUNode's (the agent owns it): only their status (a GPUNode's Accepted condition), and the queues'
    metadata.finalizers (the queue-in-use finalizer: a patch of the object is the only way to set it)."""
    writes = {g for g in rbac.grants(rbac.OPERATOR) if g.verb in ("create", "update", "patch", "delete")}
    custom = {(g.resource, g.verb) for g in writes if g.group == "gputask.io"}
    assert custom == {
        ("gputasks/status", "patch"),
        ("gputasks/finalizers", "update"),
        ("gpuclusterqueues/status", "patch"),
        ("gpuclusterqueues", "patch"),
        ("gpulocalqueues/status", "patch"),
        ("gpulocalqueues", "patch"),
        ("gpuresourceflavors", "patch"),
        ("gpunodes/status", "patch"),
    }


def test_inspect_role_lists_everything_the_live_commands_read() -> None:
    """gputask get/explain/top (gputask.live.list_all) list REBUILD_ORDER and pods: the inspect role grants
    exactly list (and get) on those, nothing to write."""
    from gputask.k8s.client import PODS
    from gputask.k8s.handlers import REBUILD_ORDER

    read = {(res.group, res.plural) for res, _ in (*REBUILD_ORDER.values(), (PODS, None))}
    granted = rbac.grants(rbac.INSPECT)
    assert {(g.group, g.resource) for g in granted if g.verb == "list"} == read
    assert {g.verb for g in granted} == {"get", "list"}


def test_the_operator_registers_event_handlers_only() -> None:
    """The operator's kopf registry has no change-detecting handler (on.create/update/delete/field/resume),
    daemon or timer: that is what makes its no-op diff-base storage (k8s.main.EventsOnlyDiffBase) safe."""
    from gputask.k8s.main import EventsOnlyDiffBase, operator_settings

    operator = Operator(Config(), client_module.KubeClient(k8s_client.ApiClient()))
    registry = operator.registry
    resources = list(registry._watching.get_all_handlers())  # noqa: SLF001 (kopf keeps these registries private)
    assert (
        [h for h in registry._changing.get_all_handlers()],  # noqa: SLF001
        [h for h in registry._spawning.get_all_handlers()],  # noqa: SLF001
        len(resources) > 5,
        isinstance(operator_settings().persistence.diffbase_storage, EventsOnlyDiffBase),
    ) == ([], [], True, True)


class Recording(FakeKubeClient):
    """A fake client that also records (group, resource, verb) of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.grants: set[Grant] = set()

    async def list(self, res: Resource, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        self.grants.add(Grant(res.group, res.plural, "list"))
        return await super().list(res, *args, **kwargs)

    async def get(self, res: Resource, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.grants.add(Grant(res.group, res.plural, "get"))
        return await super().get(res, *args, **kwargs)

    async def create(self, res: Resource, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.grants.add(Grant(res.group, res.plural, "create"))
        return await super().create(res, *args, **kwargs)

    async def delete(self, res: Resource, *args: Any, **kwargs: Any) -> bool:
        self.grants.add(Grant(res.group, res.plural, "delete"))
        return await super().delete(res, *args, **kwargs)


async def test_the_pinning_checks_and_dra_objects_are_granted() -> None:
    """Every call the Pinner makes (its check, DRA templates and shared claims made, found again, deleted, listed)
    is granted: its resources are versioned at run time, out of the scanner's sight."""
    client = Recording()
    pinner = Pinner(Config(pinning="dra"), Writer(client), OperatorMetrics())
    task = {"metadata": {"name": "t", "namespace": "ns", "uid": "u"}}
    placement = Placement(NodeName("n"), (GpuSlot(0, "GPU-0", 4096),))
    await pinner.check()
    for request in (GpuRequest(1), GpuRequest(1, memory_mib=4096, share_group="namespace ns, MPS")):
        await pinner.prepare(task, "t-1", request, placement)
        await pinner.prepare(task, "t-1", request, placement)  # 409: read back
    await pinner.job_deleted("ns", "t-1")
    await pinner.collect({}, 1)
    await pinner.rebuild([])
    assert (sorted(client.grants - rbac.grants(rbac.OPERATOR)), len(client.grants)) == ([], 10)
