"""What the Job API refuses in a pod template is refused at conversion, worded as the API server words it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import GpuSlot, NodeName, Placement
from gputask.k8s.jobs import build_job
from gputask.manifests.podspec import template_problems

MAIN = {"name": "main", "image": "busybox:1.36"}


def problems(spec: dict[str, Any]) -> list[str]:
    """The refusals of a template with this pod spec."""
    return [str(e) for e in template_problems({"spec": spec})]


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({"containers": [MAIN]}, []),
        ({"containers": [MAIN], "restartPolicy": "OnFailure"}, []),
        (
            {"containers": [MAIN], "restartPolicy": "Always"},
            ['spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure", "Never"'],
        ),
        ({}, ["spec.template.spec.containers: Required value"]),
        (
            {"containers": [{"name": "Main_1", "image": "x"}]},
            [
                'spec.template.spec.containers[0].name: Invalid value: "Main_1": a lowercase RFC 1123 label must '
                "consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric "
                "character (e.g. "
                "'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ],
        ),
        (
            {"initContainers": [MAIN], "containers": [MAIN]},
            ['spec.template.spec.containers[0].name: Duplicate value: "main"'],
        ),
        ({"containers": [{"name": "main"}]}, ["spec.template.spec.containers[0].image: Required value"]),
        (
            {"containers": [{**MAIN, "env": "X=1"}]},
            ['spec.template.spec.containers[0].env: Invalid value: "X=1": must be a list'],
        ),
        (
            {"containers": [{**MAIN, "env": [{"name": "1X", "value": "a"}, {"name": "Y", "value": 2}]}]},
            [
                'spec.template.spec.containers[0].env[0].name: Invalid value: "1X": a valid environment variable name '
                "must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit "
                "(e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is "
                "'[-._a-zA-Z][-._a-zA-Z0-9]*')",
                "spec.template.spec.containers[0].env[1].value: Invalid value: 2: must be a string",
            ],
        ),
        (
            {"containers": [{**MAIN, "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1", "memory": "x"}}}]},
            [
                'spec.template.spec.containers[0].resources.limits[memory]: Invalid value: "x": must be a non-negative '
                "quantity",
                'spec.template.spec.containers[0].resources.requests[cpu]: Invalid value: "2": must be less than or '
                "equal to cpu limit",
            ],
        ),
        (
            {"containers": [{**MAIN, "resources": "big"}]},
            ['spec.template.spec.containers[0].resources: Invalid value: "big": must be an object'],
        ),
        (
            {"containers": [{**MAIN, "ports": [{"containerPort": 0}]}]},
            [
                "spec.template.spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 and "
                "65535, "
                "inclusive"
            ],
        ),
        (
            {"containers": [{**MAIN, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]},
            ['spec.template.spec.containers[0].volumeMounts[0].name: Not found: "data"'],
        ),
        (
            {
                "containers": [{**MAIN, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
            [],
        ),
        (
            {"containers": [MAIN], "nodeSelector": {"zone": 1}},
            ['spec.template.spec.nodeSelector: Invalid value: {"zone":1}: must be a map of strings'],
        ),
        ({"containers": [MAIN], "affinity": []}, ["spec.template.spec.affinity: Invalid value: []: must be an object"]),
    ],
)
def test_template_rules(spec: dict[str, Any], refused: list[str]) -> None:
    """Each rule refuses exactly its own breakage, in the server's words; a sound template passes."""
    assert problems(spec) == refused


def test_a_template_that_is_not_an_object_or_has_no_spec() -> None:
    """A template must be an object with a pod spec."""
    assert ([str(e) for e in template_problems("pod")], [str(e) for e in template_problems({})]) == (
        ['spec.template: Invalid value: "pod": must be an object'],
        ["spec.template.spec: Required value: a pod template needs a spec with containers"],
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70000) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
QUANTITY = st.sampled_from(["1", "500m", "2Gi", "0.5"]) | st.integers(0, 64)
RESOURCES = st.fixed_dictionaries(
    {}, optional={"limits": st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITY, max_size=2)}
)


@st.composite
def sound_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Pod specs of every shape conversion accepts: names unique labels, mounts of declared volumes, ..."""
    volumes = draw(st.lists(st.sampled_from(["data", "cache"]), unique=True, max_size=2))

    def container(name: str) -> dict[str, Any]:
        return draw(
            st.fixed_dictionaries(
                {"name": st.just(name), "image": st.just("busybox:1.36")},
                optional={
                    "env": st.lists(
                        st.fixed_dictionaries(
                            {"name": st.sampled_from(["A", "B_2", "c.d"])}, optional={"value": st.text(max_size=4)}
                        ),
                        max_size=2,
                    ),
                    "resources": RESOURCES,
                    "ports": st.lists(st.fixed_dictionaries({"containerPort": st.integers(1, 65535)}), max_size=2),
                    "volumeMounts": st.lists(
                        st.sampled_from(volumes).map(lambda v: {"name": v, "mountPath": f"/{v}"}), max_size=2
                    )
                    if volumes
                    else st.just([]),
                    "command": st.lists(st.text(max_size=4), max_size=2),
                },
            )
        )

    names = draw(st.lists(st.sampled_from(["main", "side", "init-1", "x9"]), unique=True, min_size=1, max_size=3))
    pod: dict[str, Any] = {"containers": [container(n) for n in names[:2]]}
    if len(names) > 2:
        pod["initContainers"] = [container(names[2])]
    if volumes:
        pod["volumes"] = [{"name": v, "emptyDir": {}} for v in volumes]
    pod |= draw(
        st.fixed_dictionaries(
            {},
            optional={
                "restartPolicy": st.sampled_from(["Never", "OnFailure"]),
                "nodeSelector": st.dictionaries(st.sampled_from(["zone", "pool"]), st.text(max_size=3), max_size=2),
                "affinity": st.just({}) | st.just({"nodeAffinity": {}}),
                "tolerations": st.lists(st.just({"operator": "Exists"}), max_size=1),
            },
        )
    )
    return pod


# A sound pod with one field replaced by anything at all (which conversion may or may not refuse).
BROKEN = st.tuples(
    sound_pods(),
    st.sampled_from(
        ["containers", "initContainers", "restartPolicy", "affinity", "volumes", "nodeSelector", "tolerations"]
    ),
    JSON,
)
PLACEMENT = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 1024),))


def built(pod: dict[str, Any]) -> dict[str, Any]:
    """The Job of a task with this pod spec."""
    task = {"metadata": {"name": "t", "namespace": "ns", "uid": "u"}, "spec": {"template": {"spec": pod}}}
    return build_job(task, PLACEMENT, attempt=1, queue="q")


@settings(max_examples=300)
@given(pod=sound_pods())
def test_conversion_accepts_sound_templates_and_each_becomes_a_pinned_job(pod: dict[str, Any]) -> None:
    """No refusal for a sound pod spec, and its Job pins every container to the placement's GPU."""
    job = built(pod) if not problems(pod) else None
    assert job is not None
    spec = job["spec"]["template"]["spec"]
    visible = [
        e
        for c in spec["containers"] + spec.get("initContainers", [])
        for e in c["env"]
        if e["name"] == "NVIDIA_VISIBLE_DEVICES"
    ]
    assert visible == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0"}] * len(
        pod["containers"] + pod.get("initContainers", [])
    )


@settings(max_examples=400)
@given(case=BROKEN)
def test_build_job_never_raises_on_a_template_conversion_accepts(case: tuple[dict[str, Any], str, Any]) -> None:
    """Whatever the user writes in a field, a template with no refusal becomes a Job without an exception."""
    pod, field, value = case
    pod = {**pod, field: value}
    if not problems(pod):
        assert built(pod)["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
