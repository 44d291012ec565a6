"""The API permissions gputask needs: one table per component, with who needs each rule and why.

Kept beside :mod:`gputask.k8s.client` and built from its :class:`~gputask.k8s.client.Resource`
constants, so a resource's group and plural are written once. Two tests hold the tables true:

- ``tests/unit/test_rbac.py`` reads the code: every ``<receiver>.<verb>(RESOURCE, ...)`` call in
  ``gputask.k8s`` and ``gputask.agent``, whether through the client or the writer (and the writer's
  Events), and every resource the informers (or a kopf handler) watch must be granted here (a new
  API call without a rule fails the test);
- ``tests/chart/test_chart.py`` renders the Helm chart: its ClusterRoles and Roles must grant
  exactly these rules, no verb missing and none extra (least privilege).

kopf's own needs are listed too: it watches CustomResourceDefinitions to notice CRDs installed
after it starts, and posts Events. kopf peering (``--peering``, ``kopf.dev`` peering objects) is
not used: with equal priorities it pauses every replica; replicas elect a leader through a
``coordination.k8s.io`` Lease instead (``config.leaderElection``, :mod:`gputask.k8s.leader`),
granted by a Role in the Lease's namespace only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from gputask.k8s.client import (
    ADMISSIONCHECKS,
    CONFIGMAPS,
    DEVICECLASSES,
    EVENTS,
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPURESOURCEFLAVORS,
    GPUTASKS,
    JOBS,
    LEASES,
    LOCALQUEUES,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RUNTIMECLASSES,
    SERVICES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    Resource,
)

CUSTOMRESOURCEDEFINITIONS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
MUTATINGWEBHOOKCONFIGURATIONS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                                         namespaced=False)
VALIDATINGWEBHOOKCONFIGURATIONS = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                                           namespaced=False)

# Everything the operator rebuilds its state from and keeps watching through its informers (handlers.REBUILD_ORDER and
# pods), plus Kueue's LocalQueues (gputask mode) and Workloads (Kueue mode).
WATCHED = (
    GPUTASKS,
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPURESOURCEFLAVORS,
    GPUNODES,
    JOBS,
    NODES,
    NAMESPACES,
    PRIORITYCLASSES,
    WORKLOADPRIORITYCLASSES,
    PODS,
    LOCALQUEUES,
    WORKLOADS,
)
KUEUE_MANAGER_CONFIG = "kueue-manager-config"


class Grant(NamedTuple):
    """One permission: ``verb`` on ``resource`` (``plural`` or ``plural/subresource``) of ``group``."""

    group: str
    resource: str
    verb: str


@dataclass(frozen=True, slots=True)
class Rule:
    """Verbs on one resource of one API group, and the reason a component needs them."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str

    def grants(self) -> frozenset[Grant]:
        """The rule as single permissions."""
        return frozenset(Grant(self.group, self.resource, verb) for verb in self.verbs)


def rule(res: Resource, *verbs: str, why: str, sub: str | None = None) -> Rule:
    """A rule on ``res`` (or its subresource ``sub``)."""
    return Rule(res.group, f"{res.plural}/{sub}" if sub else res.plural, verbs, why)


def grants(rules: Iterable[Rule]) -> frozenset[Grant]:
    """Every single permission of ``rules``."""
    return frozenset().union(*(r.grants() for r in rules))


# The operator's ClusterRole (``gputask run``).
OPERATOR: tuple[Rule, ...] = (
    *(rule(res, "list", "watch", why="the operator's informers watch it; the operator rebuilds from it")
      for res in WATCHED),
    rule(GPUTASKS, "get", why="re-read a task after a status patch conflicted"),
    rule(GPUTASKS, "patch", sub="status", why="phase, conditions, placement, attempt and jobName of each task"),
    rule(
        GPUTASKS,
        "update",
        sub="finalizers",
        why="Jobs carry blockOwnerDeletion on their GPUTask "
        "(OwnerReferencesPermissionEnforcement, e.g. OpenShift, checks it)",
    ),
    rule(GPUCLUSTERQUEUES, "patch", sub="status", why="usage, pending and admitted counts of each queue"),
    rule(GPUCLUSTERQUEUES, "patch", why="the queue-in-use finalizer: no queue deleted under its admitted tasks"),
    rule(GPULOCALQUEUES, "patch", sub="status", why="pending and admitted counts and usage of each local queue"),
    rule(GPULOCALQUEUES, "patch", why="the queue-in-use finalizer: no local queue deleted under its admitted tasks"),
    rule(GPURESOURCEFLAVORS, "patch", why="the in-use finalizer: no flavor deleted under the tasks admitted in it"),
    rule(GPUNODES, "patch", sub="status", why="the Accepted condition: which GPU entries of the report it refused"),
    rule(JOBS, "create", "delete", why="one pinned Job per admission; deleted on eviction, preemption, task deletion"),
    rule(JOBS, "get", why="after a 409 on create, or a create whose answer was lost: whether the Job exists and was "
         "made for this task (its uid); whether a Job that lost its task label still exists"),
    rule(JOBS, "patch", why="put back the gputask.io/task label a Job lost (k8s.relabel), so its GPUs are released "
         "when it ends"),
    rule(JOBS, "update", why="an existing Job labelled gputask.io/queue-name: suspended when seen unsuspended, its "
         "placement written in and unsuspended, suspended and its template restored on eviction (k8s.userjobs)"),
    rule(JOBS, "patch", sub="status", why="an existing Job suspended by gputask: its status.startTime cleared (as "
         "Kueue's ResetStatus does), without which Kubernetes refuses any change of its template (k8s.userjobs)"),
    rule(GPUTASKS, "create", why="the GPUTask that is an existing Job's workload object (k8s.userjob_feed)"),
    rule(PODS, "create", sub="eviction", why="defragmentation moves a task through the Eviction API (dry-run first, "
         "then for real) so that no PodDisruptionBudget is broken (k8s.evictions)"),
    rule(SERVICES, "create", why="gangs: the headless Service that gives a gang's pods stable hostnames"),
    rule(PODS, "patch", why="gangs: pin a gated pod to its node and GPUs and remove its scheduling gate"),
    rule(EVENTS, "create", why="Events on GPUTasks (the operator's and kopf's)"),
    rule(EVENTS, "list", why="a Job's FailedCreate Events, read when its pods do not start"),
    rule(CUSTOMRESOURCEDEFINITIONS, "list", "watch", why="kopf notices CRDs installed after it starts"),
    rule(
        CONFIGMAPS,
        "get",
        why=f"gputask mode: read Kueue's configuration (ConfigMap {KUEUE_MANAGER_CONFIG} in kueue-system) to "
        "tell whether Kueue would suspend gputask's Jobs; the chart limits it to that name (resourceNames)",
    ),
    rule(WORKLOADS, "get", why="Kueue mode: re-read a Workload after its status patch conflicted"),
    rule(WORKLOADS, "patch", sub="status", why="Kueue mode: answer the gputask-placement admission check"),
    rule(ADMISSIONCHECKS, "get", "create", why="Kueue mode: make sure the AdmissionCheck gputask-placement exists"),
    rule(ADMISSIONCHECKS, "patch", sub="status", why="Kueue mode: mark the AdmissionCheck Active"),
    rule(RUNTIMECLASSES, "list", why="at start: which RuntimeClasses exist (jobRuntimeClassName; the pinning check)"),
    rule(DEVICECLASSES, "list", why="at start: whether resource.k8s.io is served and the NVIDIA DRA driver's "
         "DeviceClasses exist (the pinning check)"),
    rule(RESOURCECLAIMTEMPLATES, "get", "list", "create", "delete", why="pinning: dra: one per Job of whole GPUs "
         "(those GPUs by UUID), deleted with the Job; listed by a new leader to delete those of Jobs that are gone"),
    rule(RESOURCECLAIMS, "get", "list", "create", "delete", why="pinning: dra: one per shared GPU and share group, "
         "created before the first Job that uses it and deleted once none does; listed by a new leader"),
)

# The operator's Role in the Lease's namespace, only with ``config.leaderElection``.
OPERATOR_LEADER_ELECTION: tuple[Rule, ...] = (
    rule(LEASES, "get", "create", "update", why="campaign for, renew and take over the leader Lease"),
)

# The operator's ClusterRole for the Jobs' admission webhook, only with ``--webhook-listen`` (chart value
# webhook.enabled): kopf's managed configuration (settings.admission.managed, gputask.k8s.webhook.CONFIGURATION).
# kopf runs a manager for each kind of configuration once one is managed, the validating one too (with no
# webhooks: gputask has no validating handler), and stops the operator when a create is forbidden. The chart
# limits patch to the one name (resourceNames); create cannot be (RBAC does not know a name before the object).
OPERATOR_WEBHOOK: tuple[Rule, ...] = (
    rule(MUTATINGWEBHOOKCONFIGURATIONS, "create", "patch", why="kopf creates its MutatingWebhookConfiguration "
         "gputask.io when absent (409 ignored) and patches in the webhook's URL or Service and its caBundle"),
    rule(VALIDATINGWEBHOOKCONFIGURATIONS, "create", "patch", why="kopf's validating manager does the same for "
         "a ValidatingWebhookConfiguration gputask.io of no webhooks (it runs once any configuration is managed)"),
)

# What namespace users get through Kubernetes' aggregated user-facing roles (chart value
# rbac.aggregateToUserRoles): admin and edit (USER_EDIT) submit and manage tasks and local queues,
# view (USER_VIEW) reads them. Cluster-scoped queues and flavors stay with the platform team.
_READ = ("get", "list", "watch")
USER_EDIT: tuple[Rule, ...] = (
    *(
        rule(res, *_READ, "create", "update", "patch", "delete", "deletecollection",
             why="namespace users (admin, edit) submit, change and delete them")
        for res in (GPUTASKS, GPULOCALQUEUES)
    ),
    *(rule(res, *_READ, sub="status", why="namespace users read what the operator reports")
      for res in (GPUTASKS, GPULOCALQUEUES)),
)
USER_VIEW: tuple[Rule, ...] = (
    *(rule(res, *_READ, why="namespace users (view) read them") for res in (GPUTASKS, GPULOCALQUEUES)),
    *(rule(res, *_READ, sub="status", why="namespace users (view) read their status")
      for res in (GPUTASKS, GPULOCALQUEUES)),
)

# What ``gputask get``, ``explain`` and ``top`` read (gputask.live.list_all): everything the operator rebuilds
# from, and unfinished pods. Cluster-wide and read-only; the platform team binds it (ClusterRoleBinding) to
# whoever may look at the whole GPU pool. Not aggregated: a namespace viewer need not see other namespaces.
INSPECT: tuple[Rule, ...] = tuple(
    rule(res, "get", "list", why="gputask get/explain/top rebuild the operator's view from it")
    for res in (GPUTASKS, GPUCLUSTERQUEUES, GPULOCALQUEUES, GPURESOURCEFLAVORS, GPUNODES, JOBS, NODES, NAMESPACES,
                PRIORITYCLASSES, WORKLOADPRIORITYCLASSES, PODS)
)

# The agent's ClusterRole (``gputask agent``, one pod per GPU node).
AGENT: tuple[Rule, ...] = (
    rule(GPUNODES, "get", "create", "patch", why="create its node's GPUNode and set the Node as its owner"),
    rule(GPUNODES, "patch", sub="status", why="GPU inventory, health and heartbeat"),
    rule(NODES, "get", why="the Node's uid for the GPUNode's ownerReference"),
)
