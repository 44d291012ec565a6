"""The operator's informers of the kinds kopf used to watch, against a real kube-apiserver (its watch cache's 410,
its 404 for an API that is not installed), as the chart's operator ServiceAccount.

An operator instance runs in the test's process: it rebuilds from the real API and its informers feed it, while its
writer is fenced (it writes nothing: the suite's two operator processes go on as they are).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import pytest

from gputask.config import Config
from gputask.k8s import informer as informer_module
from gputask.k8s.client import KubeClient, load_api_client
from gputask.k8s.handlers import Operator
from realcluster.realstack import Installed

FLAVOR = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUResourceFlavor",
          "metadata": {"name": "informer-probe"}, "spec": {"nodeLabels": {"gputask.io/probe": "yes"}}}


async def until(probe: Callable[[], object], timeout_s: float, what: str) -> None:
    """Wait (on the event loop) until ``probe()`` is truthy; fail saying ``what`` after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not probe():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not reached within {timeout_s}s: {what}")
        await asyncio.sleep(0.1)


async def test_a_flavor_reaches_the_operator_and_a_relisting_after_410_forgets_it_once_deleted(
    installed: Installed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPUResourceFlavor created after the rebuild comes through its informer's watch; one deleted while the
    informer was stopped is forgotten when the informer, started again from a resourceVersion the API server's
    watch cache no longer keeps, is answered 410, lists again and hands the listing over. Kueue's APIs are not
    installed: their informers say so once at info level (404), with no warning."""
    monkeypatch.setattr(informer_module, "ABSENT_RETRY_S", 0.5)
    caplog.set_level(logging.INFO, logger="gputask.informer")
    client = KubeClient(load_api_client(str(installed.operator_kubeconfig)))
    operator = Operator(Config(), client)
    operator.writer.leading = lambda: False  # fenced: this instance writes nothing
    operator.leading = True
    try:
        await operator.rebuild()
        installed.cp.kubectl("create", "-f", "-", input=json.dumps(FLAVOR))
        await until(lambda: "informer-probe" in operator.controller.inventory.flavor_meta, 30, "the flavor fed")
        flavors = operator.informers["flavors"]
        await flavors.stop()
        installed.cp.kubectl("delete", "gpuresourceflavor", "informer-probe")
        flavors.start("1")  # older than the watch cache keeps: 410
        await until(lambda: flavors.relists == 1, 30, "a relisting after 410")
        kueue = [operator.informers[k] for k in ("workloadpriorityclasses", "kueuelocalqueues")]
        await until(lambda: all(i.failures >= 2 for i in kueue), 30, "Kueue's APIs looked for twice")
    finally:
        await operator._stop_informers()
        await client.close()
    said = sorted({(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records
                   if r.levelno >= logging.WARNING or "not served" in r.getMessage()})
    assert ("informer-probe" in operator.controller.inventory.flavor_meta, [i.relists for i in kueue], said) == (
        False, [0, 0], [("INFO", "Kueue LocalQueues are not served"),
                        ("INFO", "workloadpriorityclasses are not served")])
