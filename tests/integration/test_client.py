"""KubeClient's HTTP side (aiohttp) as the kubernetes client's configuration sets it up: authentication, TLS,
proxies, connection retries."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from gputask.k8s.client import LEASES, ApiError, KubeClient, _proxy, _retries, _ssl_context


async def recording_server(seen: list[dict[str, str]], refuse: set[str] = frozenset()) -> tuple[web.AppRunner, str]:
    """An HTTP server that keeps each request's method, path, query and headers, and answers ``{}`` (401 to a
    bearer token in ``refuse``)."""

    async def answer(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "path": request.path, "query": request.query_string,
                     **{k.lower(): v for k, v in request.headers.items()}})
        if request.headers.get("Authorization", "").removeprefix("Bearer ") in refuse:
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps the socket private
    return runner, f"http://127.0.0.1:{port}"


async def test_requests_carry_the_token_and_a_401_sends_again_with_the_refreshed_one() -> None:
    """Requests send the configuration's bearer token (its refresh hook asked once, not per request), the user
    agent and the writer's fieldManager; a 401 asks the hook at once and sends the request again with the new
    token, which later requests keep."""
    seen: list[dict[str, str]] = []
    runner, host = await recording_server(seen, refuse={"first"})
    configuration = k8s_client.Configuration()
    configuration.host = host
    configuration.api_key = {"authorization": "Bearer loaded"}  # as the kubeconfig loader leaves it
    tokens = iter(["first", "second", "third"])

    def refresh(config: Any) -> None:
        config.api_key = {"authorization": f"Bearer {next(tokens)}"}

    configuration.refresh_api_key_hook = refresh
    api = k8s_client.ApiClient(configuration)
    api.user_agent = "gputask-test/1"
    client = KubeClient(api, field_manager="gputask-test")
    try:
        await client.get(LEASES, "l", "default")
        await client.patch(LEASES, "l", {"spec": {}}, "default")
    finally:
        await client.close()
        await runner.cleanup()
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l"
    assert [(s["method"], s["path"], s["query"], s["authorization"], s["user-agent"], s.get("content-type"))
            for s in seen] == [
        ("GET", path, "", "Bearer first", "gputask-test/1", None),
        ("GET", path, "", "Bearer second", "gputask-test/1", None),
        ("PATCH", path, "fieldManager=gputask-test", "Bearer second", "gputask-test/1",
         "application/merge-patch+json"),
    ]


async def test_a_refused_connection_is_tried_as_often_as_configured_then_unreachable() -> None:
    """A port nobody listens on: ApiError 0 Unreachable after the configured connection retries."""
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard: nothing listens there
    configuration.retries = 1
    client = KubeClient(k8s_client.ApiClient(configuration))
    try:
        with pytest.raises(ApiError) as refused:
            await client.get(LEASES, "l", "default")
    finally:
        await client.close()
    assert (refused.value.status, refused.value.reason) == (0, "Unreachable")


def test_tls_follows_the_configuration() -> None:
    """verify_ssl off: no verification; on: the system's CAs and hostname checking, off when assert_hostname is
    False; the TLS server name and an HTTP proxy (unless no_proxy covers the server) go with each request; a
    SOCKS proxy is refused with the reason."""
    insecure, checked, unchecked = (k8s_client.Configuration() for _ in range(3))
    insecure.verify_ssl = False
    unchecked.assert_hostname = False
    unchecked.tls_server_name = "api.internal"
    proxied, bypassed, socks = (k8s_client.Configuration() for _ in range(3))
    for config in (proxied, bypassed, socks):
        config.host = "https://10.0.0.1:6443"
    proxied.proxy = bypassed.proxy = "http://proxy:3128"
    bypassed.no_proxy = "10.0.0.1"
    socks.proxy = "socks5://proxy:1080"
    contexts = [_ssl_context(c) for c in (insecure, checked, unchecked)]
    with pytest.raises(ValueError) as refused:
        _proxy(socks)
    assert (
        contexts[0],
        [(c.verify_mode, c.check_hostname) for c in contexts[1:] if isinstance(c, ssl.SSLContext)],
        [_proxy(c) for c in (unchecked, proxied, bypassed)],
        [_retries(r) for r in (None, 0, 5)],
        str(refused.value),
    ) == (
        False,
        [(ssl.CERT_REQUIRED, True), (ssl.CERT_REQUIRED, False)],
        [{"server_hostname": "api.internal"}, {"proxy": "http://proxy:3128"}, {}],
        [3, 0, 5],
        "proxy socks5://proxy:1080: only HTTP(S) proxies are supported",
    )
