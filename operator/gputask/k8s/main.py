"""Run the operator: log in, build one :class:`~gputask.k8s.handlers.Operator`, run kopf."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import kopf
import prometheus_client

from gputask.config import Config
from gputask.k8s import webhook
from gputask.k8s.client import KubeClient, load_api_client
from gputask.k8s.handlers import Operator

log = logging.getLogger("gputask")


def build_operator(config: Config, *, kubeconfig: str | None = None) -> Operator:
    """An Operator whose kopf registry logs in with the same credentials as its API client."""
    api = load_api_client(kubeconfig, pool_size=config.api_concurrency)
    lease_api = load_api_client(kubeconfig, pool_size=2)
    operator = Operator(
        config,
        KubeClient(api, workers=config.api_concurrency),
        lease_client=KubeClient(
            lease_api, workers=2, field_manager="gputask-operator-lease", timeout_s=config.lease_renew_deadline_s
        ),
    )
    conf = api.configuration

    async def login(**_: Any) -> kopf.ConnectionInfo:
        token = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
        scheme, _, value = (token or "").partition(" ")
        return kopf.ConnectionInfo(
            server=conf.host,
            ca_path=conf.ssl_ca_cert,
            insecure=not conf.verify_ssl,
            scheme=scheme or None,
            token=value or None,
            certificate_path=conf.cert_file,
            private_key_path=conf.key_file,
        )

    kopf.on.login(registry=operator.registry)(login)
    return operator


class EventsOnlyDiffBase(kopf.DiffBaseStorage):
    """kopf's diff-base storage for an operator with event handlers only (``kopf.on.event``; no on.create,
    on.update or on.field, no daemons or timers): nothing compares an object with its last-handled state, so
    there is no essence to build. kopf's default deep-copies every object on every event to build one (5% of
    the operator's CPU in a 2,000-task burst) and reads it back from an annotation. The operator registers no
    resource handler at all today (its informers watch every kind); this keeps a future event handler cheap.
    ``tests/unit/test_rbac.py`` checks the operator registers no change-detecting handler."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        """No essence: kopf then sees no change to detect."""
        return None

    def fetch(self, *, body: Any) -> Any:
        """No stored essence."""
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        """Nothing to store (only change-detecting handlers would ask)."""


KOPF_EVENT_LOGGERS = ("kopf.objects",)
"""kopf's per-object loggers: a "Handler ... succeeded" line at INFO per event (9% of the loop's time in a
2,000-task burst); at WARNING unless the operator runs with --verbose."""


def operator_settings(*, peering: str | None = None, verbose: bool = False) -> kopf.OperatorSettings:
    """kopf settings: quiet handler Events, per-event logs at WARNING unless ``verbose``, bounded watch
    timeouts, optional peering."""
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.WARNING
    settings.persistence.diffbase_storage = EventsOnlyDiffBase()
    for name in KOPF_EVENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    if peering:
        settings.peering.name, settings.peering.mandatory, settings.peering.clusterwide = peering, True, True
    else:
        settings.peering.standalone = True
    return settings


async def run_operator(
    operator: Operator,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    peering: str | None = None,
    liveness_endpoint: str | None = None,
    metrics_port: int | None = None,
    metrics_address: str = "0.0.0.0",
    verbose: bool = False,
    webhook_listen: str | None = None,
    webhook_host: str | None = None,
    webhook_service: str | None = None,
    webhook_cert_dir: Path | None = None,
) -> None:
    """Run kopf with the operator's registry until ``stop_flag`` is set (or forever).

    ``webhook_listen`` (HOST:PORT) serves the admission webhook for labelled Jobs there and registers it by URL
    (``https://<webhook_host or HOST>:PORT``, :mod:`gputask.k8s.webhook`), or by ``webhook_service``
    (``NAMESPACE/NAME``) with the certificate of ``webhook_cert_dir`` when given; raises ValueError for a bad value.

    ``liveness_endpoint`` (e.g. ``http://0.0.0.0:8080/healthz``) is kopf's probe endpoint;
    ``metrics_port`` serves the operator's Prometheus metrics on ``metrics_address`` (default every interface).
    Raises OSError when that address and port cannot be listened on.
    """
    if metrics_port:
        prometheus_client.start_http_server(metrics_port, addr=metrics_address, registry=operator.metrics.registry)
    namespace = operator.config.namespace
    settings = operator_settings(peering=peering, verbose=verbose)
    if webhook_listen:
        webhook.configure(settings, webhook_listen, host=webhook_host, service=webhook_service,
                          cert_dir=webhook_cert_dir)
        webhook.register(operator.registry, operator.config)
    try:
        await kopf.operator(
            registry=operator.registry,
            settings=settings,
            clusterwide=not namespace,
            namespaces=[namespace] if namespace else (),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            liveness_endpoint=liveness_endpoint,
        )
    finally:  # kopf has run the cleanup handlers (the Lease released): the connections can go
        await operator.client.close()
        if operator.lease_client is not operator.client:
            await operator.lease_client.close()
