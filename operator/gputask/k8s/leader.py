"""Leader election on a ``coordination.k8s.io/v1`` Lease, so only one replica schedules.

The algorithm is client-go's leaderelection, in short: the holder renews ``renewTime`` every
``renew_s``; a candidate takes the Lease when it is free or its ``renewTime`` is older than
``leaseDurationSeconds``; every write carries the resourceVersion read, so two candidates
racing for an expired Lease cannot both win (the loser gets 409 Conflict). A leader that cannot
renew for a whole lease duration steps down before anyone else can take over.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gputask.k8s.client import LEASES, AlreadyExists, ApiError, Conflict, KubeApi, NotFound

log = logging.getLogger("gputask.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _micro(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class LeaderElector:
    """Campaign for a Lease; call ``on_started`` when elected and ``on_stopped`` when not any more."""

    def __init__(
        self,
        client: KubeApi,
        *,
        identity: str,
        name: str = "gputask-operator",
        namespace: str = "default",
        lease_s: float = 15.0,
        renew_s: float = 5.0,
    ) -> None:
        self.client, self.identity, self.name, self.namespace = client, identity, name, namespace
        self.lease_s, self.renew_s = lease_s, renew_s
        self.is_leader = False

    async def run(self, on_started: Callable[[], Awaitable[None]], on_stopped: Callable[[], Awaitable[None]]) -> None:
        """Campaign and renew forever (until cancelled, which releases leadership)."""
        last_renewal = _now()
        try:
            while True:
                ok = await self.try_acquire_or_renew()
                if ok:
                    last_renewal = _now()
                    if not self.is_leader:
                        self.is_leader = True
                        log.info("%s became the leader", self.identity)
                        await on_started()
                elif self.is_leader and (_now() - last_renewal).total_seconds() >= self.lease_s:
                    self.is_leader = False
                    log.warning("%s lost the leadership", self.identity)
                    await on_stopped()
                await asyncio.sleep(self.renew_s)
        finally:
            if self.is_leader:
                self.is_leader = False
                await on_stopped()

    async def try_acquire_or_renew(self) -> bool:
        """One election step; True when this identity holds the Lease afterwards."""
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_s),
            "renewTime": _micro(now),
        }
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0},
            }
            try:
                await self.client.create(LEASES, body, self.namespace)
                return True
            except (AlreadyExists, ApiError):
                return False
        except ApiError as exc:
            log.warning("reading Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        return await self._update(lease, spec, now)

    async def _update(self, lease: dict[str, Any], spec: dict[str, Any], now: dt.datetime) -> bool:
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        renewed = _parse(current.get("renewTime")) or _parse(current.get("acquireTime"))
        duration = current.get("leaseDurationSeconds") or self.lease_s
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder and holder != self.identity and not expired:
            return False
        new_spec = {**current, **spec}
        if holder != self.identity:
            new_spec["acquireTime"] = _micro(now)
            new_spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        body = {**lease, "spec": new_spec}
        try:
            await self.client.replace(LEASES, self.name, body, self.namespace)
        except Conflict:
            return False
        except ApiError as exc:
            log.warning("updating Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        return True
