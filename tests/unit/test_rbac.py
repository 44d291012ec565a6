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
# KubeApi (client and writer) method -> Kubernetes verb.
CLIENT_VERBS = {
    "get": "get",
    "list": "list",
    "list_versioned": "list",
    "watch": "watch",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
# Writer methods that name no resource, -> the grant each needs (gputask.k8s.writer).
WRITER_CALLS = {
    "event": Grant("", "events", "create"),  # a core/v1 Event
    "evict": Grant("", "pods/eviction", "create"),  # POST pods/NAME/eviction (Eviction API), dry run or not
}
RESOURCES = {name: value for name, value in vars(client_module).items() if isinstance(value, Resource)}
WRAPPERS = ("at_version", "_resource")  # calls that give a resource constant at another version (DRA)
# Calls whose resource is a variable with no resource constant in its function, each covered elsewhere: the writer
# passes its callers' resources on (they are scanned), the informers' resources (which the rebuild lists too) are
# checked by test_every_resource_the_operator_watches_is_granted_list_and_watch, the Pinner's (versioned at run time)
# by test_the_pinning_checks_and_dra_objects_are_granted.
UNRESOLVED = {
    ("pinner.py", "get", "res"),
    ("handlers.py", "list", "informer.resource"),
    ("informer.py", "list", "self.resource"),
    ("informer.py", "watch", "self.resource"),
    ("writer.py", "create", "res"),
    ("writer.py", "delete", "res"),
    ("writer.py", "patch", "res"),
    ("writer.py", "update", "res"),
    # a task's status resource is its workload's: gputasks (status patch, get after a conflict) for the one
    # implementation, GPUTaskWorkload, whose status_resource test_workload.py checks is GPUTASKS
    ("tasks.py", "patch", "workload_of(record).status_resource"),
    ("tasks.py", "get", "workload_of(record).status_resource"),
}


def _resource_of(node: ast.expr) -> Resource | None:
    """The client.py constant an argument names, directly or through at_version(...) / self._resource(...)."""
    if isinstance(node, ast.Name):
        return RESOURCES.get(node.id)
    if isinstance(node, ast.Call) and node.args:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in WRAPPERS:
            return _resource_of(node.args[0])
    return None


def _constants_in(function: ast.AST) -> list[Resource]:
    """The resource constants a function names anywhere (the values a variable resource can take there)."""
    return [RESOURCES[n.id] for n in ast.walk(function) if isinstance(n, ast.Name) and n.id in RESOURCES]


def api_calls(source: str, module: str = "") -> tuple[set[Grant], set[tuple[str, str, str]]]:
    """Grants needed by every API call of ``source``: ``<any receiver>.<verb>(RESOURCE, ...)`` (through the client,
    the writer or anything else), ``<writer>.event(...)`` and ``<writer>.evict(...)`` (:data:`WRITER_CALLS`), and a
    call on a ``client`` or ``writer`` whose resource is a variable, with each resource constant its function names.
    Also returns the calls on a client or writer whose resource could not be told at all: (module, verb, the
    argument's text)."""
    needed: set[Grant] = set()
    unresolved: set[tuple[str, str, str]] = set()
    tree = ast.parse(source)
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    for function in functions:
        inner = {id(n) for f in ast.walk(function) if f is not function and isinstance(
            f, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(f)}
        for node in ast.walk(function):
            if id(node) in inner or not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver, verb = node.func.value, node.func.attr
            receiver_name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
            if verb in WRITER_CALLS and receiver_name == "writer":
                needed.add(WRITER_CALLS[verb])
                continue
            if verb not in CLIENT_VERBS or not node.args:
                continue
            status = any(k.arg == "status" and isinstance(k.value, ast.Constant) and k.value.value
                         for k in node.keywords)
            found = _resource_of(node.args[0])
            if found is not None:
                candidates = [found]
            elif receiver_name in ("client", "writer"):
                candidates = _constants_in(function)
                if not candidates:
                    unresolved.add((module, CLIENT_VERBS[verb], ast.unparse(node.args[0])))
            else:
                continue
            for res in candidates:
                needed.add(Grant(res.group, f"{res.plural}/status" if status else res.plural, CLIENT_VERBS[verb]))
    return needed, unresolved


def client_calls(source: str) -> set[Grant]:
    """Grants needed by the API calls of ``source`` (:func:`api_calls`)."""
    return api_calls(source)[0]


def package_calls(subpackage: str) -> set[Grant]:
    """Grants needed by every module of ``gputask.<subpackage>``."""
    return set().union(*(client_calls(path.read_text()) for path in sorted((PACKAGE / subpackage).glob("*.py"))))


def test_client_call_scanner_reads_verb_resource_and_status_subresource() -> None:
    """The scanner maps each API call on a client.py constant, through the client or the writer, to its (group,
    resource, verb); a variable resource to the constants its function names; an Event to events create, an eviction
    to pods/eviction create."""
    source = (
        "async def f(self, client):\n"
        "    await self.client.create(JOBS, body, ns)\n"
        "    await client.patch(GPUTASKS, name, body, ns, status=True)\n"
        "    await self.client.get(NODES, name)\n"
        "    await self.client.replace(LEASES, name, body, ns)\n"
        "    await self.writer.patch(JOBS, name, body, ns)\n"
        "    await self.controller.writer.delete(PODS, name, ns)\n"
        "    await self.writer.event(involved, 'Normal', 'R', 'm')\n"
        "    await self.executor.writer.evict(pod, ns, dry_run=True)\n"
        "    async for _ in self.client.watch(at_version(DEVICECLASSES, v)):\n"
        "        pass\n"
        "async def g(self, q):\n"
        "    resource = GPUCLUSTERQUEUES if q else GPULOCALQUEUES\n"
        "    await self.writer.patch(resource, name, body, status=True)\n"
        "async def h(self, resource):\n"
        "    await self.client.list(resource)\n"
        "    await other.create(resource, body)\n"
    )
    assert api_calls(source, "m.py") == ({
        Grant("batch", "jobs", "create"),
        Grant("gputask.io", "gputasks/status", "patch"),
        Grant("", "nodes", "get"),
        Grant("coordination.k8s.io", "leases", "update"),
        Grant("batch", "jobs", "patch"),
        Grant("", "pods", "delete"),
        Grant("", "events", "create"),
        Grant("", "pods/eviction", "create"),
        Grant("resource.k8s.io", "deviceclasses", "watch"),
        Grant("gputask.io", "gpuclusterqueues/status", "patch"),
        Grant("gputask.io", "gpulocalqueues/status", "patch"),
    }, {("m.py", "list", "resource")})


def test_every_client_or_writer_call_with_an_unknown_resource_is_covered_elsewhere() -> None:
    """The calls whose resource the scanner cannot tell are exactly the known ones, each checked by another test:
    a new one fails here until its resource is named or checked."""
    found = set().union(*(api_calls(path.read_text(), path.name)[1]
                          for sub in ("k8s", "agent") for path in sorted((PACKAGE / sub).glob("*.py"))))
    assert found == UNRESOLVED


def test_a_planted_missing_verb_fails_the_check() -> None:
    """Without ``patch`` on Jobs (the relabel's write through the writer, which the old scanner never saw) the
    operator's check finds exactly that grant missing."""
    granted = rbac.grants(rbac.OPERATOR) | rbac.grants(rbac.OPERATOR_LEADER_ELECTION)
    planted = granted - {Grant("batch", "jobs", "patch")}
    assert (package_calls("k8s") - planted, package_calls("k8s") - granted) == ({Grant("batch", "jobs", "patch")},
                                                                               set())


def test_a_removed_eviction_grant_fails_the_check() -> None:
    """Without ``create`` on pods/eviction (defragmentation's moves through the Eviction API, k8s.evictions) the
    operator's check finds exactly that grant missing."""
    granted = rbac.grants(rbac.OPERATOR) | rbac.grants(rbac.OPERATOR_LEADER_ELECTION)
    planted = granted - {Grant("", "pods/eviction", "create")}
    assert (package_calls("k8s") - planted, package_calls("k8s") - granted) == (
        {Grant("", "pods/eviction", "create")}, set())


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
    """Each resource the operator's kopf registry or its own informers watch (in either queueing mode) is granted
    list and watch."""
    watched = set()
    for queueing in ("gputask", "kueue"):
        operator = Operator(Config(queueing=queueing), KubeClient(k8s_client.ApiClient()))
        watched |= {
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
    metadata.finalizers (the queue-in-use finalizer: a patch of the object is the only way to set it). It creates
    one kind of GPUTask, never changing its spec afterwards: the workload object of an existing Job labelled
    gputask.io/queue-name (issue 31), which the Job owns."""
    writes = {g for g in rbac.grants(rbac.OPERATOR) if g.verb in ("create", "update", "patch", "delete")}
    custom = {(g.resource, g.verb) for g in writes if g.group == "gputask.io"}
    assert custom == {
        ("gputasks/status", "patch"),
        ("gputasks", "create"),
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
    daemon or timer: that is what makes its no-op diff-base storage (k8s.main.EventsOnlyDiffBase) safe. It has no
    event handler either: every watched kind comes through the operator's informers."""
    from gputask.k8s.main import EventsOnlyDiffBase, operator_settings

    operator = Operator(Config(), client_module.KubeClient(k8s_client.ApiClient()))
    registry = operator.registry
    resources = list(registry._watching.get_all_handlers())  # noqa: SLF001 (kopf keeps these registries private)
    assert (
        [h for h in registry._changing.get_all_handlers()],  # noqa: SLF001
        [h for h in registry._spawning.get_all_handlers()],  # noqa: SLF001
        resources,
        isinstance(operator_settings().persistence.diffbase_storage, EventsOnlyDiffBase),
    ) == ([], [], [], True)


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
    placement = Placement.one(NodeName("n"), (GpuSlot(0, "GPU-0", 4096),))
    await pinner.check()
    for request in (GpuRequest(1), GpuRequest(1, memory_mib=4096, share_group="namespace ns, MPS")):
        await pinner.prepare(task, "t-1", request, placement)
        await pinner.prepare(task, "t-1", request, placement)  # 409: read back
    await pinner.job_deleted("ns", "t-1")
    await pinner.collect({}, 1)
    await pinner.rebuild([])
    assert (sorted(client.grants - rbac.grants(rbac.OPERATOR)), len(client.grants)) == ([], 10)


def test_the_webhook_role_grants_what_kopfs_managed_configurations_write() -> None:
    """With ``--webhook-listen`` kopf manages a configuration of each kind (settings.admission.managed): it creates
    (409 ignored) and patches a Mutating- and a ValidatingWebhookConfiguration. rbac.OPERATOR_WEBHOOK grants
    exactly create and patch on both kopf selectors' resources; rbac.OPERATOR grants neither (only the chart's
    webhook.enabled binds them)."""
    import kopf
    from kopf._cogs.structs.references import MUTATING_WEBHOOK, VALIDATING_WEBHOOK  # what kopf's managers write

    from gputask.k8s import webhook

    settings = kopf.OperatorSettings()
    webhook.configure(settings, "127.0.0.1:9443")
    kopf_writes = {Grant(s.group or "", str(s.any_name), verb) for s in (MUTATING_WEBHOOK, VALIDATING_WEBHOOK)
                   for verb in ("create", "patch")}
    assert (settings.admission.managed, rbac.grants(rbac.OPERATOR_WEBHOOK),
            {g for g in rbac.grants(rbac.OPERATOR) if g.group == "admissionregistration.k8s.io"}) == (
        webhook.CONFIGURATION, kopf_writes, set())
