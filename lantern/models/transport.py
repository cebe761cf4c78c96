"""The model SDKs' HTTP clients, on the spread transport connectors use (``lantern.outbound``).

Each SDK made its own client with one connection pool, so thousands of concurrent model calls
to one provider met the cost the spread transport removes for connectors: httpcore's pool walks
all its connections on every request. Here each SDK gets a client of the HTTP library it uses
(httpx in older SDKs, its copy httpx2 in newer ones: the Anthropic SDK refuses httpx objects),
on ``outbound.POOLS`` pools of that library, with no connection limit (the ``model:<provider>``
host queue of ``lantern.models.call`` bounds the calls), one TLS context per library per
process and the SDK's own defaults otherwise (redirects followed, its socket options).

Behind a proxy named in the environment (``HTTPS_PROXY`` and the like) the SDK's own client is
kept, as it honours those variables and a client given a transport does not; every request then
goes to the one proxy anyway.
"""

from __future__ import annotations

import functools
import socket
import ssl
import urllib.request
from collections.abc import Sequence
from typing import Any

import httpx

from lantern import outbound

# A socket option as httpx takes it: (level, option, value).
SocketOption = tuple[int, int, int | bool]


def keepalive_options() -> list[SocketOption]:
    """TCP keep-alive probes after a minute idle, as the Anthropic SDK sets on its own client
    (a long answer on a dead connection fails instead of waiting out the timeout)."""
    options: list[SocketOption] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, True)]
    for name, value in (("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5), ("TCP_KEEPIDLE", 60)):
        option = getattr(socket, name, None)
        if option is not None:
            options.append((socket.IPPROTO_TCP, option, value))
    return options


def proxied() -> bool:
    return any(scheme != "no" for scheme in urllib.request.getproxies())


def http_client(
    sdk_limits: object, *, socket_options: Sequence[SocketOption] | None = None
) -> Any | None:
    """An ``AsyncClient`` of the library whose ``Limits`` the SDK's default limits are (the
    SDK's ``DEFAULT_CONNECTION_LIMITS``), on spread pools; None behind a proxy, or for a
    library other than httpx and httpx2 (the caller then keeps the SDK's own client)."""
    if proxied():
        return None
    library = type(sdk_limits).__module__.partition(".")[0]
    if library == "httpx":
        ctx = outbound.ssl_context()

        def pool(share: httpx.Limits) -> httpx.AsyncBaseTransport:
            return httpx.AsyncHTTPTransport(verify=ctx, limits=share, socket_options=socket_options)

        return httpx.AsyncClient(
            transport=outbound.spread(pool), timeout=outbound.timeout(30.0), follow_redirects=True
        )
    if library == "httpx2":
        return _httpx2_client(socket_options)
    return None


def _httpx2_client(socket_options: Sequence[SocketOption] | None) -> Any:
    import httpx2

    spread, closing = _httpx2_types()
    ctx = _httpx2_ssl_context()
    share = httpx2.Limits(
        max_connections=None, max_keepalive_connections=outbound.MAX_KEEPALIVE // outbound.POOLS
    )
    pools = [
        httpx2.AsyncHTTPTransport(verify=ctx, limits=share, socket_options=socket_options)
        for _ in range(outbound.POOLS)
    ]
    return httpx2.AsyncClient(
        transport=spread(pools, closing),
        timeout=httpx2.Timeout(30.0, pool=None),
        follow_redirects=True,
    )


@functools.cache
def _httpx2_types() -> tuple[type[Any], type[Any]]:
    """The spread transport and its response body as httpx2's kinds (imported only when an
    SDK uses httpx2: older ones do not install it)."""
    import httpx2

    class Closing(outbound.Closing, httpx2.AsyncByteStream):
        pass

    class Spread(outbound.Spreading, httpx2.AsyncBaseTransport):
        pass

    return Spread, Closing


@functools.cache
def _httpx2_ssl_context() -> ssl.SSLContext:
    """httpx2's own default context (the system's trust store, where httpx uses certifi's), made
    once: loading the CA bundle takes tens of milliseconds, and every pool needs one."""
    import httpx2

    return httpx2.create_ssl_context()
