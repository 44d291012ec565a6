"""Leader election on a ``coordination.k8s.io/v1`` Lease, so only one replica schedules.

client-go's leaderelection, in short (k8s.io/client-go/tools/leaderelection):

- every ``retry_s`` (RetryPeriod, 2 s) a replica tries to acquire or renew the Lease; every write
  carries the resourceVersion it read, so two candidates racing cannot both win (409 Conflict);
- a candidate takes a Lease held by another only once it has seen that Lease unchanged (same
  resourceVersion) for ``lease_s`` (LeaseDuration, 15 s) on its own monotonic clock, never by
  comparing the holder's ``renewTime`` with its own clock (clocks differ between machines);
- the holder steps down as soon as it has not renewed for ``renew_deadline_s`` (RenewDeadline,
  10 s), before anyone else may take over, and :meth:`LeaderElector.leading` turns False at that
  deadline even if the loop that would notice is late: every write asks it (the Writer's fence);
  a renewal that succeeds only after the deadline does not undo the step-down (writes were dropped
  in between, so the replica rebuilds from the API before it leads again); each attempt is given
  ``renew_deadline_s`` to answer (client-go's renew context);
- becoming the leader starts ``on_started`` as a task of its own (the rebuild must not stop the
  renewals); losing the lead cancels it, calls ``on_stopped`` and goes on campaigning;
- stopping (cancellation) releases the Lease so a standby takes over without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gputask.k8s.client import LEASES, AlreadyExists, ApiError, Conflict, KubeApi, NotFound

log = logging.getLogger("gputask.leader")


def _micro(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaign for a Lease; ``on_started`` when elected, ``on_stopped`` when not any more. Seconds."""

    def __init__(
        self,
        client: KubeApi,
        *,
        identity: str,
        name: str = "gputask-operator",
        namespace: str = "default",
        lease_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.identity, self.name, self.namespace = client, identity, name, namespace
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.clock = clock
        self.is_leader = False
        self.renewed_at = float("-inf")  # when this replica last wrote the Lease as its holder
        self.transitions = 0  # times this replica became the leader
        self._observed: tuple[str, str] | None = None  # (resourceVersion, holder) last seen
        self._observed_at = float("-inf")  # when that was first seen

    def leading(self) -> bool:
        """True while this replica holds the Lease and renewed it within the renew deadline."""
        return self.is_leader and self._fresh()

    def _fresh(self) -> bool:
        return self.clock() - self.renewed_at < self.renew_deadline_s

    async def run(self, on_started: Callable[[], Awaitable[None]], on_stopped: Callable[[], Awaitable[None]]) -> None:
        """Campaign and renew until cancelled; a lost lead is followed by a new campaign."""
        leading_task: asyncio.Task[None] | None = None
        try:
            while True:
                before = self.renewed_at
                held = await self._attempt()
                if self.is_leader and (not self.leading() or self.renewed_at - before >= self.renew_deadline_s):
                    # past the deadline, even if renewed late: writes were fenced meanwhile, so rebuild
                    leading_task = await self._step_down(leading_task, on_stopped)
                if held and not self.is_leader and self._fresh():
                    self.is_leader = True
                    self.transitions += 1
                    log.info("%s became the leader", self.identity)
                    leading_task = asyncio.create_task(on_started(), name="gputask-lead")
                await asyncio.sleep(self.retry_s)
        finally:
            if self.is_leader:
                await self._step_down(leading_task, on_stopped)
                with contextlib.suppress(ApiError, asyncio.CancelledError):
                    await asyncio.shield(self.release())

    async def _step_down(
        self, leading_task: asyncio.Task[None] | None, on_stopped: Callable[[], Awaitable[None]]
    ) -> None:
        """Stop acting: cancel the leading task (a rebuild in progress), then ``on_stopped``."""
        self.is_leader = False
        log.warning("%s lost the leadership (no renewal for %gs)", self.identity, self.renew_deadline_s)
        if leading_task is not None and not leading_task.done():
            leading_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await leading_task
        await on_stopped()
        return None

    async def _attempt(self) -> bool:
        """:meth:`try_acquire_or_renew`, given ``renew_deadline_s`` to answer (client-go's renew context)."""
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), self.renew_deadline_s)
        except TimeoutError:
            log.warning("the Lease %s/%s did not answer within %gs", self.namespace, self.name, self.renew_deadline_s)
            return False

    async def try_acquire_or_renew(self) -> bool:
        """One election step; True when this identity holds the Lease afterwards."""
        now = dt.datetime.now(dt.UTC)
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except NotFound:
            return await self._create(now)
        except ApiError as exc:
            log.warning("reading Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        return await self._update(lease, now)

    async def _create(self, now: dt.datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {**self._spec(now), "acquireTime": _micro(now), "leaseTransitions": 0},
        }
        started = self.clock()
        try:
            await self.client.create(LEASES, body, self.namespace)
        except (AlreadyExists, ApiError):
            return False
        self.renewed_at = started
        return True

    def _spec(self, now: dt.datetime) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_s), "renewTime": _micro(now)}

    def _expired(self, lease: dict[str, Any]) -> bool:
        """Whether another holder's Lease has been seen unchanged for its whole duration (our clock)."""
        spec = lease.get("spec") or {}
        seen = (str((lease.get("metadata") or {}).get("resourceVersion")), str(spec.get("holderIdentity") or ""))
        if seen != self._observed:
            self._observed, self._observed_at = seen, self.clock()
        duration = spec.get("leaseDurationSeconds") or self.lease_s
        return self.clock() - self._observed_at >= duration

    async def _update(self, lease: dict[str, Any], now: dt.datetime) -> bool:
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        if holder and holder != self.identity and not self._expired(lease):
            return False
        new_spec = {**current, **self._spec(now)}
        if holder != self.identity:
            new_spec["acquireTime"] = _micro(now)
            new_spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        started = self.clock()
        try:
            await self.client.replace(LEASES, self.name, {**lease, "spec": new_spec}, self.namespace)
        except Conflict:
            return False
        except ApiError as exc:
            log.warning("updating Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        self.renewed_at = started  # the renewal counts from when it was sent, not answered
        return True

    async def release(self) -> None:
        """Give the Lease up (holder cleared, 1 s duration) so a standby need not wait for it to expire."""
        lease = await self.client.get(LEASES, self.name, self.namespace)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        now = _micro(dt.datetime.now(dt.UTC))
        released = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now}
        await self.client.replace(LEASES, self.name, {**lease, "spec": released}, self.namespace)
