"""Leader election (gputask.k8s.leader) against the fake client, with slow and hanging Lease answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gputask.k8s.client import LEASES, Resource
from gputask.k8s.leader import LeaderElector
from gputask.testing.fake import FakeKubeClient


class SlowLeases(FakeKubeClient):
    """A fake whose Lease calls take ``delays`` seconds each, one per call in order (then none)."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    async def _slow(self, res: Resource) -> None:
        if res is LEASES and self.delays:
            await asyncio.sleep(self.delays.pop(0))

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        await self._slow(res)
        return await super().get(res, name, namespace)


class Record:
    """What the elector told us, in order: 'started' and 'stopped'."""

    def __init__(self) -> None:
        self.said: list[str] = []

    async def started(self) -> None:
        self.said.append("started")

    async def stopped(self) -> None:
        self.said.append("stopped")


def elector(client: FakeKubeClient, identity: str = "a") -> LeaderElector:
    return LeaderElector(client, identity=identity, namespace="ns", lease_s=1.0, renew_deadline_s=0.3, retry_s=0.05)


async def test_a_renewal_answered_after_the_deadline_steps_down_and_leads_again_with_a_new_start() -> None:
    """Writes were fenced between the deadline and the late renewal, so the replica does not simply go
    on: it stops (the operator drops its state) and starts again (the operator rebuilds from the API)."""
    client, record = SlowLeases(), Record()
    me = elector(client)
    campaign = asyncio.create_task(me.run(record.started, record.stopped))
    await asyncio.sleep(0.2)
    assert record.said == ["started"] and me.leading()
    client.delays = [0.35]  # one slow GET: that renewal lands after the 0.3 s deadline
    await asyncio.sleep(1.0)
    campaign.cancel()
    await asyncio.gather(campaign, return_exceptions=True)
    assert record.said == ["started", "stopped", "started", "stopped"], record.said  # the last: cancelled
    assert me.transitions == 2


async def test_a_lease_that_does_not_answer_ends_the_lead_at_the_deadline() -> None:
    client, record = SlowLeases(), Record()
    me = elector(client)
    campaign = asyncio.create_task(me.run(record.started, record.stopped))
    await asyncio.sleep(0.2)
    client.delays = [30.0] * 20  # the API server hangs
    await asyncio.sleep(0.45)  # past the 0.3 s deadline (plus one retry)
    assert not me.leading()
    assert record.said == ["started", "stopped"]
    campaign.cancel()
    await asyncio.gather(campaign, return_exceptions=True)


async def test_a_standby_takes_the_lease_only_after_seeing_it_unchanged_for_its_duration() -> None:
    client, first, second = FakeKubeClient(), Record(), Record()
    a, b = elector(client, "a"), elector(client, "b")
    run_a = asyncio.create_task(a.run(first.started, first.stopped))
    await asyncio.sleep(0.1)
    run_b = asyncio.create_task(b.run(second.started, second.stopped))
    await asyncio.sleep(0.5)
    assert a.leading() and not b.is_leader
    run_a.cancel()  # cancelled: releases the Lease, so b need not wait for it to expire
    await asyncio.gather(run_a, return_exceptions=True)
    await asyncio.sleep(0.2)
    assert b.leading()
    assert client.all(LEASES, "ns")[0]["spec"]["holderIdentity"] == "b"
    run_b.cancel()
    await asyncio.gather(run_b, return_exceptions=True)
    assert first.said == ["started", "stopped"] and second.said == ["started", "stopped"]


async def test_a_paused_holder_is_replaced_after_the_lease_duration_and_does_not_lead_when_resumed() -> None:
    """Holder 'a' stops renewing (a paused process, simulated by never letting its loop run: no task);
    'b' waits the 1 s duration on its own clock, then takes over; 'a' sees another holder and stays out."""
    client, second = FakeKubeClient(), Record()
    a, b = elector(client, "a"), elector(client, "b")
    assert await a.try_acquire_or_renew()
    run_b = asyncio.create_task(b.run(second.started, second.stopped))
    await asyncio.sleep(0.7)
    assert not b.is_leader  # 0.7 s < the 1 s Lease duration
    await asyncio.sleep(0.6)
    assert b.leading()
    assert not await a.try_acquire_or_renew()
    run_b.cancel()
    await asyncio.gather(run_b, return_exceptions=True)


async def test_a_step_that_ignores_cancellation_does_not_hang_stop(caplog: pytest.LogCaptureFixture) -> None:
    """Background.stop waits a bounded time for a cancelled step; one that will not end is logged with its stack
    and left behind, so stepping down or shutting down never hangs on it."""
    from gputask.k8s.background import Background

    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # a bug: swallows its cancellation

    loop = Background("stubborn", stubborn, lambda: 0.01)
    loop.start()
    await asyncio.sleep(0.05)
    task = loop._task  # noqa: SLF001 (to end it after the test's point is made)
    await asyncio.wait_for(loop.stop(timeout_s=0.2), timeout=5)
    release.set()
    assert task is not None
    for _ in range(3):  # the step sees the release and returns; the loop then ends on the next cancel
        task.cancel()
        await asyncio.wait({task}, timeout=1)
    assert ("stubborn did not stop within 0.2s of being cancelled" in caplog.text, task.done()) == (True, True)
