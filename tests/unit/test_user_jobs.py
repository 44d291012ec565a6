"""Existing Jobs (issue 31): the opt-in, the webhook's mutation (a Job in, the Job out, every field), the GPUTask that
is a Job's workload object, admission written into the Job and eviction by suspend-and-restore, on FakeKubeClient."""

from __future__ import annotations

import copy
import json
from typing import Any

from gputask.config import Config
from gputask.core import GpuRequest, GpuSlot, NodeName, Placement, TaskKey
from gputask.core.fit import Toleration
from gputask.k8s.client import GPUTASKS, JOBS
from gputask.k8s.jobrecords import JobRecord, job_record
from gputask.k8s.pinning import Pinning
from gputask.k8s.records import TaskRecords
from gputask.k8s.userjobs import (
    UserJobWorkload,
    admit,
    mutate_job,
    opted_in,
    refusal,
    suspend_and_restore,
    workload_task,
)
from gputask.k8s.webhook import parse_listen, self_signed
from gputask.k8s.workload import PodSetInfo, Workload, workload_of
from gputask.k8s.writer import Writer
from gputask.testing.fake import FakeKubeClient

ENV = [
    {"name": "NVIDIA_VISIBLE_DEVICES",
     "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gputask.io/visible-devices']"}}},
    {"name": "GPUTASK_GPU_MEMORY_MIB",
     "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gputask.io/gpu-memory-mib']"}}},
]
PLACEMENT = Placement.one(NodeName("node-b"), (GpuSlot(2, "GPU-2", 81920), GpuSlot(3, "GPU-3", 81920)))


def user_job(**spec: Any) -> dict[str, Any]:
    """A Job as a user writes it: two GPUs on its trainer, a sidecar without, an init container with one; its own
    node selector, toleration, affinity, labels and annotations."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "labels": {"gputask.io/queue-name": "team", "app": "t"},
                     "annotations": {"owner": "me"}},
        "spec": {**spec, "template": {
            "metadata": {"labels": {"app": "t"}, "annotations": {"note": "x"}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
                "initContainers": [{"name": "fetch", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "containers": [
                    {"name": "trainer", "image": "t", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                     "resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "4"}, "requests": {"nvidia.com/gpu": 2}}},
                    {"name": "side", "image": "s", "resources": {"requests": {"memory": "1Gi"}}},
                ]}}},
    }


def test_only_labelled_jobs_outside_excluded_namespaces_and_not_kueue_s_are_opted_in() -> None:
    job = user_job()
    unlabelled = copy.deepcopy(job)
    del unlabelled["metadata"]["labels"]["gputask.io/queue-name"]
    kueue = copy.deepcopy(job)
    kueue["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq"
    assert [opted_in(job), opted_in(unlabelled), opted_in(kueue), opted_in(job, excluded=["ml"]),
            opted_in(job, queueing="kueue")] == [True, False, False, False, False]


def test_the_webhook_suspends_moves_gpu_requests_into_the_annotation_and_adds_the_pinning_env() -> None:
    """Every field the mutation touches, exactly; nothing else changes and the Job given is left as it was."""
    job = user_job(parallelism=1)
    given = copy.deepcopy(job)
    out = mutate_job(job)
    assert job == given
    expected = copy.deepcopy(job)
    expected["spec"]["suspend"] = True
    expected["metadata"]["annotations"].update({
        "gputask.io/gpu-request": json.dumps(
            {"containers": {"fetch": {"nvidia.com/gpu": "1"}, "trainer": {"nvidia.com/gpu": "2"}}, "gpus": 2},
            separators=(",", ":"), sort_keys=True),
        "gputask.io/mutated-by": "webhook"})
    pod = expected["spec"]["template"]["spec"]
    pod["initContainers"][0]["resources"] = {}
    pod["initContainers"][0]["env"] = ENV
    pod["containers"][0]["resources"] = {"limits": {"cpu": "4"}}
    pod["containers"][0]["env"] = ENV  # the user's NVIDIA_VISIBLE_DEVICES=all is replaced: it would expose all
    pod["containers"][1]["env"] = ENV
    assert out == expected


def test_a_shared_request_s_gpu_memory_moves_too_and_a_request_already_annotated_is_kept() -> None:
    job = user_job()
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"limits": {"nvidia.com/gpu": "1", "gputask.io/gpu-memory": "12Gi"}}
    job["spec"]["template"]["spec"]["initContainers"] = []
    out = mutate_job(job)
    assert json.loads(out["metadata"]["annotations"]["gputask.io/gpu-request"]) == {
        "gpus": 1, "gpuMemory": "12Gi", "containers": {"trainer": {"nvidia.com/gpu": "1",
                                                                   "gputask.io/gpu-memory": "12Gi"}}}
    assert "resources" not in out["spec"]["template"]["spec"]["containers"][0] or not out["spec"]["template"][
        "spec"]["containers"][0]["resources"]
    job["metadata"]["annotations"]["gputask.io/gpu-request"] = '{"gpus":4}'
    assert mutate_job(job)["metadata"]["annotations"]["gputask.io/gpu-request"] == '{"gpus":4}'


def test_the_workload_object_is_a_gputask_owned_by_the_job() -> None:
    job = mutate_job(user_job())
    job["metadata"]["uid"] = "job-uid"
    job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "high"
    job["spec"]["template"]["spec"]["priorityClassName"] = "urgent"
    task = workload_task(job)
    assert task["metadata"] == {
        "name": "job-train", "namespace": "ml",
        "labels": {"gputask.io/queue-name": "team", "kueue.x-k8s.io/priority-class": "high"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid",
                             "controller": True}]}
    assert {k: v for k, v in task["spec"].items() if k != "template"} == {
        "queueName": "team", "gpus": 2, "priorityClassName": "urgent",
        "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}}
    assert task["spec"]["template"] == job["spec"]["template"]


def test_jobs_gputask_cannot_run_wait_with_a_reason() -> None:
    webhooked = mutate_job(user_job())
    assert refusal(webhooked, Pinning()) is None
    assert "per-pod pinning" in str(refusal(mutate_job(user_job(parallelism=3, completions=3)), Pinning()))
    assert refusal(mutate_job(user_job(parallelism=3, completions=1)), Pinning()) is None  # one pod at a time
    assert "resourceClaims" in str(refusal(webhooked, Pinning(mode="dra")))
    assert "without gputask's webhook" in str(refusal(user_job(), Pinning()))


def test_a_job_created_without_the_webhook_is_told_the_resources_it_still_requests() -> None:
    """The refusal names what the containers ask of the device plugin: a shared request's gputask.io/gpu-memory
    alone is not called nvidia.com/gpu (a new user read that of the README's own shared Job)."""
    shared = user_job()
    for kind in ("initContainers", "containers"):
        for container in shared["spec"]["template"]["spec"][kind]:
            container["resources"] = {"limits": {"gputask.io/gpu-memory": "4Gi"}} if container["name"] == "trainer" \
                else {}
    assert str(refusal(shared, Pinning())).startswith("its containers still request gputask.io/gpu-memory in their "
                                                      "resources (it was created without gputask's webhook)")
    assert str(refusal(user_job(), Pinning())).startswith("its containers still request nvidia.com/gpu in their")


def _record(client: FakeKubeClient, job: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    stored_job = client.put(JOBS, job, "ml")
    task = client.put(GPUTASKS, workload_task(stored_job), "ml")
    return TaskRecords().add(TaskKey("ml/job-train"), task["metadata"]["uid"], task), stored_job


async def test_admission_writes_the_placement_into_the_job_and_eviction_restores_it_byte_for_byte() -> None:
    """Admitted: unsuspended, the task label and admission annotations on the Job, the template pinned to the node
    (the user's nodeSelector, tolerations and affinity kept, the flavor's toleration added) with the GPUs in its
    annotations. Stopped: suspended, the template's fields exactly as the user wrote them, nothing of the admission
    left but the kept original; admitted again, the same."""
    client = FakeKubeClient()
    record, stored = _record(client, mutate_job(user_job()))
    workload = workload_of(record)
    assert isinstance(workload, UserJobWorkload) and isinstance(workload, Workload)
    assert workload.pod_sets() == (PodSetInfo("main", 1, stored["spec"]["template"]),)
    writer = Writer(client)
    admission = workload.job_for(PLACEMENT, attempt=1, queue="cq", flavor="a100",
                                 tolerations=[Toleration("flavor", "Equal", "a100", "NoSchedule")],
                                 request=GpuRequest(2))
    await workload.start(writer, admission, "ml")
    (job,) = client.all(JOBS, "ml")
    template = job["spec"]["template"]
    assert job["spec"]["suspend"] is False
    assert (job_record(job).task_uid, job_record(job).placement, job["metadata"]["labels"]) == (
        record.uid, PLACEMENT, {"gputask.io/queue-name": "team", "app": "t", "gputask.io/task": "job-train",
                                "gputask.io/queue": "cq", "gputask.io/flavor": "a100"})
    assert template["metadata"]["labels"] == {"app": "t", "gputask.io/task": "job-train", "gputask.io/queue": "cq"}
    assert {k: v for k, v in template["metadata"]["annotations"].items() if k != "gputask.io/placement"} == {
        "note": "x", "gputask.io/visible-devices": "GPU-2,GPU-3"}
    assert template["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert template["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"},
                                               {"key": "flavor", "operator": "Equal", "value": "a100",
                                                "effect": "NoSchedule"}]
    assert template["spec"]["affinity"] == {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}}}
    assert template["spec"]["containers"] == stored["spec"]["template"]["spec"]["containers"]  # never changed

    assert await workload.stop(writer, JobRecord("train", "ml", record.uid, 1, PLACEMENT), "Preempted") is True
    (evicted,) = client.all(JOBS, "ml")
    assert evicted["spec"]["suspend"] is True
    assert json.dumps(evicted["spec"]["template"], sort_keys=True) == json.dumps(stored["spec"]["template"],
                                                                               sort_keys=True)
    assert job_record(evicted) is None  # holds nothing once its pods are gone
    again = workload.job_for(Placement.one(NodeName("node-c"), (GpuSlot(0, "GPU-0", 81920),)), attempt=2, queue="cq")
    await workload.start(writer, again, "ml")
    (readmitted,) = client.all(JOBS, "ml")
    assert readmitted["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "node-c"]
    assert readmitted["spec"]["template"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    await workload.stop(writer, JobRecord("train", "ml", record.uid, 2, None), "NodeFailure")
    (restored,) = client.all(JOBS, "ml")
    assert restored["spec"]["template"] == stored["spec"]["template"]
    client.objects.clear()
    assert await workload.stop(writer, JobRecord("train", "ml", record.uid, 2, None), "NodeFailure") is False


def test_restore_takes_the_kept_original_not_what_the_template_says_now() -> None:
    """A template admitted once keeps its original in the annotation: a second admission over a template that still
    has the first's pin (a stop never written) is built from, and restored to, the original."""
    job = mutate_job(user_job())
    job["metadata"]["uid"] = "u"
    admission = {"metadata": {"labels": {}, "annotations": {}},
                 "spec": {"fields": {"nodeSelector": {"kubernetes.io/hostname": "n1"}}}}
    first = admit(job, admission)
    second = admit(first, {**admission, "spec": {"fields": {"nodeSelector": {"kubernetes.io/hostname": "n2"}}}})
    assert second["metadata"]["annotations"]["gputask.io/original-scheduling"] == first["metadata"]["annotations"][
        "gputask.io/original-scheduling"]
    assert suspend_and_restore(second)["spec"]["template"] == job["spec"]["template"]


def test_cdi_pinning_and_a_shared_request_go_into_the_template_s_annotations() -> None:
    client = FakeKubeClient()
    job = mutate_job(user_job())
    job["metadata"]["uid"] = "u"
    record = TaskRecords().add(TaskKey("ml/job-train"), "t-uid", client.put(GPUTASKS, workload_task(job), "ml"))
    shared = Placement.one(NodeName("node-b"), (GpuSlot(2, "GPU-2", 12288),))
    fields = UserJobWorkload(record).job_for(shared, attempt=1, queue="cq", pinning=Pinning(mode="cdi"),
                                             request=GpuRequest(1, memory_mib=12288))["spec"]["fields"]
    assert {k: v for k, v in fields["annotations"].items() if k != "gputask.io/placement"} == {
        "note": "x", "gputask.io/visible-devices": "void", "gputask.io/gpu-memory-mib": "12288",
        "cdi.k8s.io/gputask": "nvidia.com/gpu=GPU-2"}


def test_the_webhook_listens_where_told_with_a_certificate_for_that_host(tmp_path: Any) -> None:
    from cryptography import x509

    assert parse_listen("127.0.0.1:9443") == ("127.0.0.1", 9443)
    assert parse_listen("[::1]:9443") == ("::1", 9443)
    for bad in ("9443", "host:", "host:0", "host:x"):
        try:
            parse_listen(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    cert, _ = self_signed("10.0.0.7", tmp_path)
    sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.0.0.7"]


def test_the_configuration_excludes_kube_system_by_default() -> None:
    assert Config().user_jobs.exclude_namespaces == ("kube-system",)
    assert Config.model_validate({"userJobs": {"excludeNamespaces": ["a"]}}).user_jobs.exclude_namespaces == ("a",)


async def test_in_a_cluster_the_webhook_is_registered_by_its_service_with_a_certificate_for_the_service(
        tmp_path: Any) -> None:
    """``--webhook-service gputask-system/gputask-webhook``: the client configuration kopf writes names the Service
    on the listening port (no URL) with the self-signed certificate as its caBundle, and that certificate is valid
    for the Service's DNS names; a bad NAMESPACE/NAME is refused."""
    import base64

    import kopf
    from cryptography import x509

    from gputask.k8s.webhook import ServiceWebhookServer, configure, parse_service
    from gputask.testing.controlplane import free_port

    port = free_port()
    settings = kopf.OperatorSettings()
    configure(settings, f"127.0.0.1:{port}", certs=tmp_path, service="gputask-system/gputask-webhook")
    server = settings.admission.server
    assert isinstance(server, ServiceWebhookServer)

    async def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("no request is made")

    served = server(never)
    config = await served.__anext__()
    await served.aclose()
    cert = (tmp_path / "webhook.crt").read_bytes()
    sans = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert ({k: v for k, v in config.items() if k != "caBundle"}, base64.b64decode(config["caBundle"]),
            sans.get_values_for_type(x509.DNSName)) == (
        {"service": {"namespace": "gputask-system", "name": "gputask-webhook", "port": port, "path": ""}}, cert,
        ["localhost", "gputask-webhook.gputask-system.svc", "gputask-webhook.gputask-system.svc.cluster.local"],
    )
    for bad in ("name", "/name", "ns/", "a/b/c"):
        try:
            parse_service(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_a_mounted_tls_secret_is_served_and_its_ca_is_the_ca_bundle(tmp_path: Any) -> None:
    """``--webhook-cert-dir``: kopf's server is given the Secret's tls.crt, tls.key and ca.crt (so every replica
    serves one certificate and the caBundle is the CA that signed it); nothing self-signed is made."""
    import kopf

    from gputask.k8s.webhook import configure

    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_text(name)
    settings = kopf.OperatorSettings()
    configure(settings, "0.0.0.0:9443", cert_dir=tmp_path, service="ns/svc")
    server = settings.admission.server
    assert (server.certfile, server.pkeyfile, server.cafile, sorted(p.name for p in tmp_path.iterdir())) == (
        str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), str(tmp_path / "ca.crt"),
        ["ca.crt", "tls.crt", "tls.key"])


class BatchValidation(FakeKubeClient):
    """The fake API with batch/v1's rule on Job updates: the pod template may change only when the Job replaced is
    suspended and has no ``status.startTime`` (kube-apiserver v1.28 answers 422 ``field is immutable``)."""

    async def replace(self, res: Any, name: str, body: Any, namespace: str | None = None, *,
                      guard: Any = None) -> dict[str, Any]:
        from gputask.k8s.resources import ApiError

        if res is JOBS:
            old = await self.get(res, name, namespace)
            if body["spec"]["template"] != old["spec"]["template"] and not (
                    old["spec"].get("suspend") and not (old.get("status") or {}).get("startTime")):
                raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: spec.template: field is immutable')
        return await super().replace(res, name, body, namespace, guard=guard)


async def test_eviction_suspends_clears_the_start_time_then_restores_as_the_api_server_allows() -> None:
    """A running admitted Job (the Job controller set its startTime): stopping it is three writes the real API
    server accepts: suspend (template untouched), the status's startTime cleared, the template restored. Once
    stopped it is suspended, startTime-less and exactly as the user wrote it; admitted again elsewhere, accepted."""
    client = BatchValidation()
    record, stored = _record(client, mutate_job(user_job()))
    workload, writer = workload_of(record), Writer(client)
    await workload.start(writer, workload.job_for(PLACEMENT, attempt=1, queue="cq"), "ml")
    await client.patch(JOBS, "train", {"status": {"startTime": "2026-01-01T00:00:00Z", "active": 1}}, "ml",
                       status=True)
    client.calls.clear()
    assert await workload.stop(writer, JobRecord("train", "ml", record.uid, 1, PLACEMENT), "NodeFailure") is True
    (evicted,) = client.all(JOBS, "ml")
    assert ([c[0] for c in client.calls if c[0] not in ("get", "list")], evicted["spec"]["suspend"],
            "startTime" in evicted["status"], evicted["spec"]["template"] == stored["spec"]["template"]) == (
        ["replace", "patch-status", "replace"], True, False, True)
    again = workload.job_for(Placement.one(NodeName("node-c"), (GpuSlot(0, "GPU-0", 81920),)), attempt=2, queue="cq")
    await workload.start(writer, again, "ml")
    (readmitted,) = client.all(JOBS, "ml")
    assert (readmitted["spec"]["suspend"], readmitted["spec"]["template"]["metadata"]["annotations"][
        "gputask.io/visible-devices"]) == (False, "GPU-0")
