"""The admission webhook for existing Jobs (issue 31), on kopf's own admission support.

:func:`register` adds a mutating handler (``@kopf.on.mutate``) for ``batch/v1`` Jobs on CREATE, selected by an
``objectSelector`` on the label ``gputask.io/queue-name`` (kopf builds it from the handler's label filter: other
Jobs never reach it) with ``failurePolicy: Fail`` (``ignore_failures=False``). It answers with the JSON patch of
:func:`~gputask.k8s.userjobs.mutate_job` for a Job gputask admits (:func:`~gputask.k8s.userjobs.opted_in`).

:func:`configure` serves it: kopf's :class:`kopf.WebhookServer` on ``--webhook-listen HOST:PORT`` with a
self-signed certificate made here (``cryptography``; kopf's own generator needs ``certbuilder``, which gputask does
not install) for that host and ``--webhook-host``, and kopf's managed MutatingWebhookConfiguration
(``settings.admission.managed``, named :data:`CONFIGURATION`), registered by URL with the certificate as its
``caBundle``. kopf deletes that configuration when the operator stops.

In a cluster (the chart's ``webhook.enabled``) ``--webhook-service NAMESPACE/NAME`` registers it by a Service
reference instead of a URL (:class:`ServiceWebhookServer`; the API server resolves a Service, not cluster DNS), and
``--webhook-cert-dir DIR`` serves the certificate of a mounted ``kubernetes.io/tls`` Secret (``tls.crt``,
``tls.key``, and ``ca.crt`` as the ``caBundle`` when present: cert-manager writes all three), so every replica
serves the same certificate; kopf re-reads the files when they change (a rotation) and patches the configuration.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import kopf

from gputask.config import Config
from gputask.k8s.userjobs import QUEUE_NAME_LABEL, mutate_job, opted_in

log = logging.getLogger("gputask.webhook")

CONFIGURATION = "gputask.io"
"""The name of the MutatingWebhookConfiguration kopf manages (its webhooks are ``<id>.gputask.io``)."""
HANDLER_ID = "userjobs"


def register(registry: kopf.OperatorRegistry, config: Config) -> None:
    """Add the Jobs' mutating handler to ``registry``."""

    @kopf.on.mutate("batch", "v1", "jobs", id=HANDLER_ID, operation="CREATE", registry=registry,
                    labels={QUEUE_NAME_LABEL: kopf.PRESENT}, ignore_failures=False, side_effects=False)
    async def mutate(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        job = dict(body)
        if not opted_in(job, excluded=config.user_jobs.exclude_namespaces, queueing=config.queueing):
            return
        try:
            mutated = mutate_job(job)
        except ValueError as exc:
            raise kopf.AdmissionError(f"gputask: {exc}", code=422) from exc

        def apply(raw: Any) -> None:
            raw.clear()
            raw.update(mutated)

        patch.fns.append(apply)


def self_signed(host: str, directory: Path, *, days: int = 365, names: Sequence[str] = ()) -> tuple[Path, Path]:
    """A self-signed certificate and its key (PEM files in ``directory``) for ``host`` (an IP address or a DNS
    name; ``localhost``, ``127.0.0.1`` and the DNS ``names`` are added), valid ``days`` days. Returns
    (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names_extra = list(names)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    names += [x509.DNSName(n) for n in names_extra]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "webhook.crt", directory / "webhook.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9443`` for IPv6) as (host, port); ValueError otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--webhook-listen {listen!r}: give HOST:PORT, e.g. 127.0.0.1:9443")
    return host.strip("[]"), int(port)


class ServiceWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, registered by a Service reference: each client configuration kopf's server yields
    (``url``, ``caBundle``) becomes ``service: {namespace, name, port}`` with the same ``caBundle``; kopf appends
    the handler's id to the Service's ``path`` as it does to a URL."""

    def __init__(self, *, service_namespace: str, service_name: str, service_port: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service = {"namespace": service_namespace, "name": service_name, "port": service_port}

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        """Serve as kopf's server does; yield each client configuration by Service."""
        async for config in super().__call__(fn):
            found: dict[str, Any] = {"service": {**self.service, "path": ""}}
            if "caBundle" in config:
                found["caBundle"] = config["caBundle"]
            yield found


def parse_service(service: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` as (namespace, name); ValueError otherwise."""
    namespace, sep, name = service.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--webhook-service {service!r}: give NAMESPACE/NAME, e.g. gputask-system/gputask-webhook")
    return namespace, name


def configure(settings: kopf.OperatorSettings, listen: str, *, host: str | None = None,
              certs: Path | None = None, service: str | None = None, cert_dir: Path | None = None) -> None:
    """Serve the webhook on ``listen`` (HOST:PORT) and let kopf register it: by URL (``https://<host>:<port>``,
    ``host`` defaulting to the listening host), or with ``service`` (``NAMESPACE/NAME``) by that Service, on the
    same port. The certificate: ``cert_dir``'s ``tls.crt`` and ``tls.key`` (``ca.crt`` as the ``caBundle`` when
    there, else ``tls.crt``) when given; otherwise a self-signed one (for the host, and for the Service's DNS
    names) written to ``certs`` (default a new temporary directory). Raises ValueError for a bad ``listen`` or
    ``service``."""
    addr, port = parse_listen(listen)
    public = host or addr
    target = parse_service(service) if service else None
    if cert_dir is not None:
        cert, key = cert_dir / "tls.crt", cert_dir / "tls.key"
        ca: Path | None = cert_dir / "ca.crt" if (cert_dir / "ca.crt").is_file() else None
    else:
        directory = certs or Path(tempfile.mkdtemp(prefix="gputask-webhook-"))
        names = [f"{target[1]}.{target[0]}.svc", f"{target[1]}.{target[0]}.svc.cluster.local"] if target else []
        cert, key = self_signed(public, directory, names=names)
        ca = None
    tls = {"certfile": str(cert), "pkeyfile": str(key), "cafile": str(ca) if ca else None}
    if target is not None:
        settings.admission.server = ServiceWebhookServer(service_namespace=target[0], service_name=target[1],
                                                         service_port=port, addr=addr, port=port, **tls)
        where = f"Service {target[0]}/{target[1]} port {port}"
    else:
        settings.admission.server = kopf.WebhookServer(addr=addr, port=port, host=public, **tls)
        where = f"https://{public}:{port}"
    settings.admission.managed = CONFIGURATION
    log.info("serving the Jobs' admission webhook on %s:%d, called at %s (registered as %s)", addr, port, where,
             CONFIGURATION)


__all__ = ["CONFIGURATION", "ServiceWebhookServer", "configure", "parse_listen", "parse_service", "register",
           "self_signed"]
