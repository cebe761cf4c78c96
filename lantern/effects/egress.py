"""The egress policy for tenant-controlled URLs (docs/security.md).

An HTTP connector's URL is a tenant's template, and its answer becomes a step output the
tenant reads back, so an unchecked URL would let any tenant read the operator's network (a
cloud metadata service, an admin port on loopback). Before connecting, the host is resolved
and every candidate address checked: loopback, private, link-local, multicast, unspecified
and every other non-public address is refused unless ``LANTERN_EGRESS_ALLOW`` lists it.

The check lives in the connection layer (an httpcore network backend) rather than in front of
the request, for two reasons: the socket is opened to the very address that was checked (a
second lookup could answer differently: DNS rebinding), and every hop of a redirect opens its
connection through the same check. TLS still verifies the certificate against the URL's host
name and sends it as SNI, and the Host header is the URL's, so nothing else changes.

Operator settings (``OPENAI_BASE_URL``, ``LANTERN_SMTP_URL``) are trusted and never pass here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from lantern import outbound
from lantern.errors import StepError, UsageError

SETTING = "LANTERN_EGRESS_ALLOW"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressRefused(StepError):
    """A tenant URL points at an address the policy refuses. Never retried: the address
    will not become public by trying again."""

    code = "egress_refused"

    def __init__(self, host: str, port: int, address: str, kind: str) -> None:
        self.address = address
        shown = f"[{address}]" if ":" in address else address
        where = host if host == address else f"{host} ({shown})"
        super().__init__(
            f"egress refused: {where} port {port} is a {kind} address; "
            f"list {host if host != address else shown} in {SETTING} to allow it",
            error_class="connector",
            retryable=False,
        )

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "code": self.code}


@dataclass(frozen=True)
class _Entry:
    name: str | None  # a host name as written in URLs (lowercase), or None
    network: IPNetwork | None  # an address or CIDR, or None
    port: int | None  # None: any port

    def allows(self, host: str, port: int, address: IPAddress) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return address in self.network
        return self.name == host


@dataclass(frozen=True)
class EgressPolicy:
    """What may be reached although it is not public. The default allows nothing."""

    entries: tuple[_Entry, ...] = ()

    @classmethod
    def parse(cls, raw: str | None) -> EgressPolicy:
        """``LANTERN_EGRESS_ALLOW``: comma-separated hosts, ``host:port``, ``[v6]:port``,
        addresses or CIDRs. A malformed entry is a usage error, never silently dropped."""
        entries = [_parse_entry(part.strip()) for part in (raw or "").split(",") if part.strip()]
        return cls(tuple(entries))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EgressPolicy:
        return cls.parse(env.get(SETTING))

    def refusal(self, host: str, port: int, address: IPAddress) -> str | None:
        """Why ``address`` may not be reached (its kind), or None when it may."""
        kind = non_public(address)
        if kind is None:
            return None
        plain = _unmapped(address)
        name = host.lower().rstrip(".")
        if any(e.allows(name, port, plain) for e in self.entries):
            return None
        return kind

    async def resolve(self, host: str, port: int) -> str:
        """The address to connect to for ``host``: the first candidate the policy allows.
        Raises EgressRefused when none is allowed, naming the first refused one."""
        bare = host.strip("[]")
        candidates = await _addresses(bare, port)
        refused: tuple[IPAddress, str] | None = None
        for address in candidates:
            kind = self.refusal(bare, port, address)
            if kind is None:
                return str(address)
            refused = refused or (address, kind)
        assert refused is not None  # _addresses never answers an empty list
        raise EgressRefused(bare, port, str(refused[0]), refused[1])


def non_public(address: IPAddress) -> str | None:
    """The kind of a non-public address ("loopback", "private", ...), None for a public one."""
    address = _unmapped(address)
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "non-public"  # shared (100.64/10), reserved, documentation ranges, ...
    return None


def _unmapped(address: IPAddress) -> IPAddress:
    """``::ffff:127.0.0.1`` is 127.0.0.1 to the kernel, so it is judged as that."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _parse_entry(text: str) -> _Entry:
    try:
        if "/" in text:
            return _Entry(None, ipaddress.ip_network(text, strict=False), None)
        host, port = text, None
        if text.startswith("["):
            inside, _, rest = text[1:].partition("]")
            host = inside
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(text)
                port = _port(rest[1:])
        elif text.count(":") == 1:
            host, raw_port = text.split(":")
            port = _port(raw_port)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            if not host or any(c in host for c in " /@?#[]"):
                raise ValueError(text) from None
            return _Entry(host.lower().rstrip("."), None, port)
        return _Entry(None, ipaddress.ip_network(_unmapped(address)), port)
    except ValueError:
        raise UsageError(f"{SETTING}: {text!r} is not a host, host:port, address or CIDR") from None


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(text)
    return port


async def _addresses(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        # As a failed connection: the http connector retries it like any network failure.
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
    found: list[IPAddress] = []
    for info in infos:
        # The scope of a link-local v6 address ("fe80::1%eth0") does not change its kind.
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in found:
            found.append(address)
    if not found:
        raise httpcore.ConnectError(f"cannot resolve {host}: no addresses")
    return found


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Opens each connection to an address the policy allowed, found by one lookup."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = await self.policy.resolve(host, port)
        return await self.inner.connect_tcp(
            address,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("egress refused: unix sockets are never reachable")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class CheckedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport with its connection pool opening connections through the
    policy. httpx has no public hook for a network backend, so the pool it built is replaced
    by one with the same settings and ours (tests/hostile fail if this ever stops working)."""

    def __init__(self, policy: EgressPolicy, *, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        super().__init__(verify=outbound.ssl_context(), limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=outbound.ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_CheckedBackend(policy),
        )


def client(policy: EgressPolicy, *, limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    """The client for tenant URLs. No proxy from the environment: a proxy would make the
    connection (and its lookup) itself, past the check. Without ``limits``, its requests are
    spread over several pools as ``lantern.outbound.spread`` does, each checked."""
    transport: httpx.AsyncBaseTransport
    if limits is None:
        transport = outbound.spread(lambda share: CheckedTransport(policy, limits=share))
    else:
        transport = CheckedTransport(policy, limits=limits)
    return httpx.AsyncClient(transport=transport, trust_env=False)
