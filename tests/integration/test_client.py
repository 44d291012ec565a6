"""KubeClient's HTTP side (aiohttp) as the kubernetes client's configuration sets it up: authentication, TLS,
proxies, connection retries. TLS runs against real HTTPS servers with certificates from a throwaway CA (trustme),
loaded the way the operator loads a kubeconfig or its in-cluster service account."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from aiohttp import web
from kubernetes import client as k8s_client
from kubernetes.config import incluster_config

from gputask.k8s import client as client_module
from gputask.k8s.client import LEASES, ApiError, KubeClient, _proxy, _retries, _ssl_context, load_api_client


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


async def test_a_watch_refused_401_refreshes_the_token_for_the_next_watch() -> None:
    """A watch answered 401 (the token rotated) asks the configuration's hook at once: the next watch carries the
    new token, without waiting for the regular refresh."""
    seen: list[dict[str, str]] = []
    runner, host = await recording_server(seen, refuse={"first"})
    configuration = k8s_client.Configuration()
    configuration.host = host
    configuration.api_key = {"authorization": "Bearer loaded"}  # as the kubeconfig loader leaves it
    tokens = iter(["first", "second"])

    def refresh(config: Any) -> None:
        config.api_key = {"authorization": f"Bearer {next(tokens)}"}

    configuration.refresh_api_key_hook = refresh
    client = KubeClient(k8s_client.ApiClient(configuration))
    outcomes = []
    try:
        for _ in range(2):
            try:
                outcomes.append([batch async for batch in client.watch(LEASES, "default", resource_version="1")])
            except ApiError as exc:
                outcomes.append(exc.status)
    finally:
        await client.close()
        await runner.cleanup()
    assert (outcomes, [s["authorization"] for s in seen]) == ([401, []], ["Bearer first", "Bearer second"])


async def test_a_refused_connection_is_tried_as_often_as_configured_then_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port nobody listens on: each retry waits its doubling backoff (0.2 s, 0.4 s: never a hot loop), then
    ApiError 0 Unreachable after the configured connection retries."""
    waits: list[float] = []
    backoff = client_module.doubling_backoff_s

    def recorded(failures: int, base_s: float, max_s: float) -> float:
        waits.append(backoff(failures, base_s, max_s))
        return 0.0

    monkeypatch.setattr(client_module, "doubling_backoff_s", recorded)
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard: nothing listens there
    configuration.retries = 2
    client = KubeClient(k8s_client.ApiClient(configuration))
    try:
        with pytest.raises(ApiError) as refused:
            await client.get(LEASES, "l", "default")
    finally:
        await client.close()
    assert (refused.value.status, refused.value.reason, waits) == (0, "Unreachable", [0.2, 0.4])


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


async def tls_server(
    seen: list[dict[str, str]], ca: trustme.CA, *, client_ca: trustme.CA | None = None, watch_lines: int = 0
) -> tuple[web.AppRunner, int]:
    """An HTTPS server on 127.0.0.1 with a certificate of ``ca`` for that IP (as a kube-apiserver's serving
    certificate names its service IP), asking for a client certificate of ``client_ca`` when given. It keeps
    each request's method, path, bearer token and client certificate CN, and answers ``{}``, or a watch with
    ``watch_lines`` ADDED events."""

    async def answer(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair[0] for pair in (peer or {}).get("subject", ()))
        seen.append({"method": request.method, "path": request.path,
                     "authorization": request.headers.get("Authorization", ""), "cn": subject.get("commonName", "")})
        if request.query.get("watch") != "true":
            return web.json_response({})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for i in range(watch_lines):
            event = {"type": "ADDED", "object": {"metadata": {"name": f"l{i}", "resourceVersion": str(i + 2)}}}
            await response.write(json.dumps(event).encode() + b"\n")
        return response

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    if client_ca is not None:
        client_ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps it private


def kubeconfig(path: Path, server: str, ca: trustme.CA, user: trustme.LeafCert, proxy: str | None = None) -> str:
    """A kubeconfig as kind and kubeadm write it: CA, client certificate and key embedded as base64 data (and
    the cluster's ``proxy-url`` when ``proxy`` is given)."""
    b64 = lambda blob: base64.b64encode(blob.bytes()).decode()  # noqa: E731
    cluster = {"server": server, "certificate-authority-data": b64(ca.cert_pem)}
    cluster |= {"proxy-url": proxy} if proxy else {}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kind-gpu",
        "clusters": [{"name": "kind-gpu", "cluster": cluster}],
        "users": [{"name": "kind-gpu", "user": {"client-certificate-data": b64(user.cert_chain_pems[0]),
                                                 "client-key-data": b64(user.private_key_pem)}}],
        "contexts": [{"name": "kind-gpu", "context": {"cluster": "kind-gpu", "user": "kind-gpu"}}],
    }))
    return str(path)


async def test_a_kubeconfig_with_embedded_certificates_talks_mutual_tls_to_the_server(tmp_path: Path) -> None:
    """The operator's own loading (load_api_client) of a kind-style kubeconfig: the server's certificate is
    checked against the embedded CA, the client certificate is presented (the server requires one), and a
    GET and a watch both go over TLS."""
    seen: list[dict[str, str]] = []
    cluster_ca, client_ca = trustme.CA(), trustme.CA()
    runner, port = await tls_server(seen, cluster_ca, client_ca=client_ca, watch_lines=2)
    user = client_ca.issue_cert("kubernetes-admin", common_name="kubernetes-admin")
    api = load_api_client(kubeconfig(tmp_path / "config", f"https://127.0.0.1:{port}", cluster_ca, user))
    client = KubeClient(api)
    try:
        got = await client.get(LEASES, "l", "default")
        watched = [e["object"]["metadata"]["name"] async for batch in client.watch(
            LEASES, "default", resource_version="1") for e in batch]
    finally:
        await client.close()
        await runner.cleanup()
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    assert (got, watched, [(s["method"], s["path"], s["cn"]) for s in seen]) == (
        {}, ["l0", "l1"], [("GET", f"{path}/l", "kubernetes-admin"), ("GET", path, "kubernetes-admin")])


async def test_a_server_certificate_from_another_ca_is_refused_at_once_with_the_reason(tmp_path: Path) -> None:
    """The kubeconfig's CA did not sign the server's certificate: ApiError 0 Unreachable whose message says the
    certificate could not be verified, sent once (trying again cannot fix a certificate)."""
    seen: list[dict[str, str]] = []
    server_ca, other_ca = trustme.CA(), trustme.CA()
    runner, port = await tls_server(seen, server_ca)
    user = other_ca.issue_cert("kubernetes-admin", common_name="kubernetes-admin")
    api = load_api_client(kubeconfig(tmp_path / "config", f"https://127.0.0.1:{port}", other_ca, user))
    client = KubeClient(api)
    attempts: list[str] = []
    real_request = client._http().request

    def counted(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args[1])
        return real_request(*args, **kwargs)

    client._http().request = counted  # type: ignore[method-assign]
    try:
        with pytest.raises(ApiError) as refused:
            await client.get(LEASES, "l", "default")
    finally:
        await client.close()
        await runner.cleanup()
    assert ((refused.value.status, refused.value.reason), "certificate verify failed" in str(refused.value),
            len(attempts), seen) == ((0, "Unreachable"), True, 1, [])


async def test_in_cluster_the_service_account_token_and_ca_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a pod (KUBERNETES_SERVICE_HOST/PORT set, the service account's token and ca.crt mounted): the
    server is checked against ca.crt and each request carries the token (the kubernetes library writes the
    scheme as "bearer", which the API server reads without regard to case)."""
    seen: list[dict[str, str]] = []
    ca = trustme.CA()
    runner, port = await tls_server(seen, ca)
    (tmp_path / "token").write_text("eyJhbGciOiJSUzI1NiJ9.sa-token")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    client = KubeClient(load_api_client())
    try:
        await client.get(LEASES, "l", "default")
    finally:
        await client.close()
        await runner.cleanup()
    assert [(s["path"], s["authorization"], s["cn"]) for s in seen] == [
        ("/apis/coordination.k8s.io/v1/namespaces/default/leases/l", "bearer eyJhbGciOiJSUzI1NiJ9.sa-token", "")]


async def connect_proxy(tunnels: list[str]) -> tuple[asyncio.Server, int]:
    """An HTTP proxy that serves CONNECT only (as HTTPS goes through a corporate proxy): it records each target
    and pipes bytes both ways."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        method, target, _ = head.split("\r\n", 1)[0].split(" ", 2)
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_kubeconfig_proxy_url_tunnels_tls_through_the_proxy(tmp_path: Path) -> None:
    """``proxy-url`` in the kubeconfig's cluster: requests and watches go through the proxy's CONNECT tunnel, with
    TLS (and the client certificate) end to end to the API server."""
    seen: list[dict[str, str]] = []
    tunnels: list[str] = []
    cluster_ca, client_ca = trustme.CA(), trustme.CA()
    runner, port = await tls_server(seen, cluster_ca, client_ca=client_ca, watch_lines=1)
    proxy, proxy_port = await connect_proxy(tunnels)
    user = client_ca.issue_cert("kubernetes-admin", common_name="kubernetes-admin")
    api = load_api_client(kubeconfig(tmp_path / "config", f"https://127.0.0.1:{port}", cluster_ca, user,
                                     proxy=f"http://127.0.0.1:{proxy_port}"))
    client = KubeClient(api)
    try:
        await client.get(LEASES, "l", "default")
        watched = [e["object"]["metadata"]["name"] async for batch in client.watch(
            LEASES, "default", resource_version="1") for e in batch]
    finally:
        await client.close()
        await runner.cleanup()
        proxy.close()
    assert (watched, [(s["method"], s["cn"]) for s in seen], set(tunnels)) == (
        ["l0"], [("GET", "kubernetes-admin"), ("GET", "kubernetes-admin")], {f"127.0.0.1:{port}"})
