"""The client's configuration and connections: the ``kubernetes`` client's configuration (kubeconfig or
in-cluster) loaded once, its TLS context, its proxy, its retries. Used by :class:`gputask.k8s.client.KubeClient`
(which re-exports these names)."""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import should_bypass_proxies

from gputask import __version__

log = logging.getLogger("gputask.client")


def load_api_client(
    kubeconfig: str | None = None,
    *,
    user_agent: str = "gputask-operator",
    pool_size: int = 16,
    context: str | None = None,
    retries: int | None = None,
) -> k8s_client.ApiClient:
    """An ApiClient from ``kubeconfig``, else the in-cluster config, else ~/.kube/config (``$KUBECONFIG``).

    ``context`` names a kubeconfig context (default: its current-context; given, the in-cluster config is
    not tried). ``pool_size`` bounds the connections of the ``kubernetes`` client's own pool (its generated API
    classes; :class:`KubeClient` opens its own, ``workers`` of them); ``retries`` how often a connection that
    cannot be opened is tried again (None: 3).
    Raises ``kubernetes.config.ConfigException`` for a missing file or context.
    """
    configuration = k8s_client.Configuration()
    if kubeconfig:
        if not os.path.isfile(os.path.expanduser(kubeconfig)):
            raise k8s_config.ConfigException(f"kubeconfig {kubeconfig}: no such file")
        k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    elif context:
        k8s_config.load_kube_config(context=context, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    if retries is not None:
        configuration.retries = retries
    api = k8s_client.ApiClient(configuration)
    api.user_agent = f"{user_agent}/{__version__}"
    return api


def _retries(configured: Any) -> int:
    """Connection attempts to repeat: ``configuration.retries`` (an int, or urllib3's Retry with ``total``), 3 when
    unset (urllib3's default)."""
    if configured is None:
        return 3
    total = getattr(configured, "total", configured)
    return max(0, int(total)) if isinstance(total, int) and not isinstance(total, bool) else 0


def _ssl_context(configuration: k8s_client.Configuration) -> ssl.SSLContext | bool:
    """TLS as the configuration says: its CA (file or data), its client certificate, hostname checking unless
    ``assert_hostname`` is False; False (no verification) with ``verify_ssl`` off."""
    if not configuration.verify_ssl:
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None,
                                         cadata=_text(getattr(configuration, "ca_cert_data", None)))
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if configuration.assert_hostname is False:
        context.check_hostname = False
    return context


def _proxy(configuration: k8s_client.Configuration) -> dict[str, Any]:
    """aiohttp's per-request proxy and TLS server name arguments from the configuration (an HTTP(S) proxy unless
    ``no_proxy`` covers the server). Raises ValueError for a SOCKS proxy, which aiohttp does not speak."""
    extra: dict[str, Any] = {}
    name = getattr(configuration, "tls_server_name", None) or (
        configuration.assert_hostname if isinstance(configuration.assert_hostname, str) else None)
    if name:
        extra["server_hostname"] = name
    proxy = configuration.proxy
    if proxy and not should_bypass_proxies(configuration.host, configuration.no_proxy or ""):
        if not proxy.startswith(("http://", "https://")):
            raise ValueError(f"proxy {proxy}: only HTTP(S) proxies are supported")
        extra["proxy"] = proxy
        if configuration.proxy_headers:
            extra["proxy_headers"] = dict(configuration.proxy_headers)
    return extra


# What client-go makes of an error answer whose body is no Kubernetes Status (a load balancer's HTML page, the
# max-in-flight/APF filter's text/plain 429): a reason and message by code, as NewGenericServerResponse does
# (k8s.io/apimachinery/pkg/api/errors/errors.go); here the start of the body follows the message.


def _text(data: str | bytes | None) -> str | None:
    return data.decode() if isinstance(data, bytes) else data


__all__ = ["load_api_client"]
