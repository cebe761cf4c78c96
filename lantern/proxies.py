"""The HTTP proxy the environment names for a Lantern server (``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY``, ``NO_PROXY``), checked before a client of the server is made.

The command line and the SDK take the same proxy (httpx reads it from the environment too).
Only an http:// proxy is used. Any other kind (``socks5://``, say) is refused in one usage
line when the client is made; left to httpx, it surfaced as an ImportError for a package
Lantern does not install.
"""

from __future__ import annotations

import os
from urllib.parse import SplitResult, urlsplit

from lantern.errors import UsageError


def proxy_for(server: str) -> SplitResult | None:
    """The proxy the environment names for the server at URL ``server``, or None; UsageError
    for one that is not an http:// URL."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return None  # the usual case, spared urllib.request's imports
    import urllib.request

    target = urlsplit(server)
    scheme, host = target.scheme, target.hostname
    if not host:
        return None
    named = urllib.request.getproxies()
    url = named.get(scheme) or named.get("all")
    if not url or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"the proxy for {scheme}:// must be an http:// URL: {shown}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise UsageError(f"the proxy for {scheme}:// has a bad port: {shown}") from exc
    return parts
