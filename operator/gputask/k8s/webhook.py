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
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import tempfile
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


def self_signed(host: str, directory: Path, *, days: int = 365) -> tuple[Path, Path]:
    """A self-signed certificate and its key (PEM files in ``directory``) for ``host`` (an IP address or a DNS
    name; ``localhost`` and ``127.0.0.1`` are added). Returns (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
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


def configure(settings: kopf.OperatorSettings, listen: str, *, host: str | None = None,
              certs: Path | None = None) -> None:
    """Serve the webhook on ``listen`` (HOST:PORT) and let kopf register it by URL (``https://<host>:<port>``,
    ``host`` defaulting to the listening host), with a self-signed certificate written to ``certs`` (default a new
    temporary directory). Raises ValueError for a bad ``listen``."""
    addr, port = parse_listen(listen)
    public = host or addr
    directory = certs or Path(tempfile.mkdtemp(prefix="gputask-webhook-"))
    cert, key = self_signed(public, directory)
    settings.admission.server = kopf.WebhookServer(addr=addr, port=port, host=public, certfile=str(cert),
                                                   pkeyfile=str(key))
    settings.admission.managed = CONFIGURATION
    log.info("serving the Jobs' admission webhook on https://%s:%d (registered as %s)", public, port, CONFIGURATION)


__all__ = ["CONFIGURATION", "configure", "parse_listen", "register", "self_signed"]
