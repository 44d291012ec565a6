"""What a real kube-apiserver does that the operator's client and informer must survive, through the emulator (which
answers as the API server documents it) or through a small HTTP server that answers as a real one in front of it
would: paged LISTs as one snapshot and their expired continue tokens, watch bookmarks, throttling (429 with
Retry-After from API Priority and Fairness), Status bodies and bodies that are no Status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from gputask.k8s.client import (
    GPUTASKS,
    JOBS,
)
from gputask.testing.emulator import EXPIRED_CONTINUE
from harness import Cluster

TASKS_PATH = "/apis/gputask.io/v1alpha1/namespaces/ns/gputasks"


def task(name: str) -> dict[str, Any]:
    """A GPUTask body."""
    return {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"gpus": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def job(name: str) -> dict[str, Any]:
    """A Job body."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox"}]}}}}


async def get(session: aiohttp.ClientSession, path: str, **params: str) -> tuple[int, dict[str, Any]]:
    """GET a path of the emulator: (status, JSON body)."""
    async with session.get(path, params=params) as response:
        return response.status, await response.json()


async def until(probe: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``probe()`` is true (fail after ``timeout_s``)."""
    async with asyncio.timeout(timeout_s):
        while not probe():
            await asyncio.sleep(0.01)


# -- item 1: LIST pagination ----------------------------------------------------------------------------------------


async def test_a_paged_list_is_one_snapshot_at_the_first_pages_version(cluster: Cluster) -> None:
    """Every page of a paged LIST shows the objects as they were at the first page's resourceVersion (a task
    deleted meanwhile is still served, one created meanwhile is not) and carries that version."""
    for name in ("a", "b", "c"):
        await cluster.client.create(GPUTASKS, task(name), "ns")
    async with aiohttp.ClientSession(cluster.server.url) as session:
        _, first = await get(session, TASKS_PATH, limit="2")
        await cluster.client.delete(GPUTASKS, "c", "ns")
        await cluster.client.create(GPUTASKS, task("bb"), "ns")
        _, second = await get(session, TASKS_PATH, limit="2", **{"continue": first["metadata"]["continue"]})
    pages = [([t["metadata"]["name"] for t in page["items"]], page["metadata"]["resourceVersion"],
              "continue" in page["metadata"]) for page in (first, second)]
    version = first["metadata"]["resourceVersion"]
    assert pages == [(["a", "b"], version, True), (["c"], version, False)]


async def test_an_expired_continue_token_is_410_expired_with_an_inconsistent_token(cluster: Cluster) -> None:
    """A continue token older than the kept history (etcd compacted) is answered 410 Expired with the API server's
    message and a continue token that serves the rest of the list as it is now."""
    for name in ("a", "b", "c"):
        await cluster.client.create(GPUTASKS, task(name), "ns")
    async with aiohttp.ClientSession(cluster.server.url) as session:
        _, first = await get(session, TASKS_PATH, limit="2")
        await cluster.client.create(GPUTASKS, task("d"), "ns")
        cluster.server.emulator.compact()
        status, expired = await get(session, TASKS_PATH, limit="2", **{"continue": first["metadata"]["continue"]})
        _, rest = await get(session, TASKS_PATH, **{"continue": expired["metadata"]["continue"]})
    assert (status, expired["code"], expired["reason"], expired["message"], [t["metadata"]["name"] for t in
            rest["items"]]) == (410, 410, "Expired", EXPIRED_CONTINUE, ["c", "d"])


# -- item 2: WATCH --------------------------------------------------------------------------------------------------


async def test_a_watch_that_allows_bookmarks_gets_one_before_its_timeout(cluster: Cluster) -> None:
    """A watch with allowWatchBookmarks gets a BOOKMARK (only metadata.resourceVersion: the store's latest, moved on
    by another resource's change) 2 s before its timeoutSeconds; a watch without it gets none."""
    rv = str(cluster.server.emulator.resource_version)
    async with aiohttp.ClientSession(cluster.server.url) as session:
        async def events(**extra: str) -> list[dict[str, Any]]:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "3", **extra}
            async with session.get(TASKS_PATH, params=params) as response:
                return [json.loads(line) for line in (await response.read()).splitlines() if line.strip()]

        watches = asyncio.gather(events(allowWatchBookmarks="true"), events())
        await asyncio.sleep(0.2)
        await cluster.client.create(JOBS, job("j"), "ns")
        with_bookmarks, without = await watches
    latest = str(cluster.server.emulator.resource_version)
    bookmark = {"type": "BOOKMARK", "object": {"kind": "GPUTask", "apiVersion": "gputask.io/v1alpha1",
                                               "metadata": {"resourceVersion": latest}}}
    assert (with_bookmarks, without) == ([bookmark], [])


# -- item 3: throttling ---------------------------------------------------------------------------------------------


async def test_the_emulator_throttles_as_api_priority_and_fairness_does(cluster: Cluster) -> None:
    """An injected 429 is answered as APF rejects: Retry-After and a text/plain body, no Status."""
    cluster.server.emulator.inject("GET", "/gputasks", 429, retry_after=3)
    async with aiohttp.ClientSession(cluster.server.url) as session, session.get(TASKS_PATH) as response:
        answer = (response.status, response.headers["Retry-After"], response.content_type, await response.text())
    assert answer == (429, "3", "text/plain", "Too many requests, please try again later.\n")


# -- item 4: error bodies -------------------------------------------------------------------------------------------


# -- the informer's failures ----------------------------------------------------------------------------------------


# -- item 5: connections --------------------------------------------------------------------------------------------
