"""The email delivery: one message over SMTP, claimed and recorded through ``Deliveries``.

The message carries ``Message-ID: <KEY@lantern>`` and ``Idempotency-Key: KEY``, KEY being the
step attempt's idempotency key, so a message re-sent after a crash (its receipt claimed, its
outcome never recorded) carries the same Message-ID as the first and a receiver or a mail
store can drop the copy. A receipt recorded delivered is never sent again: a re-drive
returns the recorded answer, ``{"messageId", "accepted", "rejected", "response"}``.

The server comes from ``LANTERN_SMTP_URL``, read when the delivery is dispatched:

    smtp://HOST[:PORT]                            plain SMTP, port 25 by default
    smtp://USER:PASS@HOST[:PORT]                  the same, with AUTH (login)
    smtp://[USER:PASS@]HOST[:PORT]?starttls=true  STARTTLS, required (a server that does not
                                                  offer it is an error), then AUTH when a
                                                  user is given; port 587 by default
    smtps://[USER:PASS@]HOST[:PORT]               TLS from the first byte; port 465 by default

USER and PASS are percent-encoded (``p%40ss`` for ``p@ss``). TLS certificates are verified
against the system's trust store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` point OpenSSL at
another). Plain ``smtp://`` never upgrades on its own.

Failures are ``connector`` step errors carrying the server's answer: a 4xx reply (to the
connection, MAIL, RCPT or DATA) is retryable, a 5xx reply is not; a connection that cannot be
made or is dropped is retryable; a timeout is a retryable ``timeout`` error; a missing or
malformed ``LANTERN_SMTP_URL`` is not retryable. A recipient refused while others were
accepted does not fail the delivery: it is listed under ``rejected`` with the server's reply.
When every recipient is refused the delivery fails, retryable only if every refusal was 4xx.
"""

from __future__ import annotations

import email.policy
import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate, getaddresses
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import aiosmtplib

from lantern import config
from lantern.effects.claims import Deliveries
from lantern.errors import StepError

SMTP_URL_VARIABLE = "LANTERN_SMTP_URL"
DEFAULT_SENDER = "lantern@localhost"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def message_id(idempotency_key: str) -> str:
    """The Message-ID of the email sent by the step attempt that has this key."""
    return f"<{idempotency_key}@lantern>"


@dataclass(frozen=True)
class SmtpServer:
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    starttls: bool = False
    tls: bool = False  # implicit TLS (smtps://)

    def __str__(self) -> str:
        scheme = "smtps" if self.tls else "smtp"
        user = f"{self.username}@" if self.username else ""
        query = "?starttls=true" if self.starttls else ""
        return f"{scheme}://{user}{self.host}:{self.port}{query}"  # never the password


def parse_smtp_url(url: str) -> SmtpServer:
    """Parse a LANTERN_SMTP_URL; ValueError (never quoting the password) when it is not one."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{SMTP_URL_VARIABLE} is not a URL: {exc}") from None
    if parts.scheme not in ("smtp", "smtps"):
        raise ValueError(
            f"{SMTP_URL_VARIABLE} must start with smtp:// or smtps://, not {parts.scheme!r}"
        )
    if not parts.hostname:
        raise ValueError(f"{SMTP_URL_VARIABLE} names no host (smtp://HOST:PORT)")
    if parts.path not in ("", "/"):
        raise ValueError(f"{SMTP_URL_VARIABLE} takes no path ({parts.path!r})")
    starttls = False
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name != "starttls":
            raise ValueError(f"{SMTP_URL_VARIABLE}: unknown parameter {name!r} (known: starttls)")
        if value.lower() not in _TRUE | _FALSE:
            raise ValueError(f"{SMTP_URL_VARIABLE}: starttls must be true or false")
        starttls = value.lower() in _TRUE
    tls = parts.scheme == "smtps"
    if tls and starttls:
        raise ValueError(f"{SMTP_URL_VARIABLE}: smtps:// is TLS already; drop ?starttls")
    if port is None:
        port = 465 if tls else 587 if starttls else 25
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return SmtpServer(parts.hostname, port, username, password, starttls, tls)


def addresses(value: Any, field: str) -> list[Address]:
    """The addresses of a rendered ``to``/``cc``/``from``: a string (commas allowed) or a list."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    found: list[Address] = []
    for item in items:
        if not isinstance(item, str):
            raise _bad(f"data.{field} must be an address or a list of addresses, not {item!r}")
        if "\r" in item or "\n" in item:
            raise _bad(f"data.{field}: an address cannot contain a line break: {item!r}")
        for name, addr in getaddresses([item]):
            if not addr:
                continue
            local, at, domain = addr.rpartition("@")
            if not at or not local or not domain:
                raise _bad(f"data.{field}: {addr!r} is not an email address")
            try:
                found.append(Address(display_name=name, addr_spec=addr))
            except (ValueError, IndexError, HeaderParseError) as exc:
                raise _bad(f"data.{field}: {addr!r} is not an email address: {exc}") from None
    return found


def build_message(
    *,
    to: Sequence[Address],
    cc: Sequence[Address],
    sender: Address,
    subject: str,
    text: str | None,
    html: str | None,
    idempotency_key: str,
) -> EmailMessage:
    """The message: a text part, an HTML part, or both as multipart/alternative."""
    if "\r" in subject or "\n" in subject:
        raise _bad(f"data.subject cannot contain a line break: {subject!r}")
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = tuple(to)
    if cc:
        msg["Cc"] = tuple(cc)
    msg["Subject"] = subject
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = message_id(idempotency_key)
    msg["Idempotency-Key"] = idempotency_key
    if text is not None:
        msg.set_content(text)
        if html is not None:
            msg.add_alternative(html, subtype="html")
    elif html is not None:
        msg.set_content(html, subtype="html")
    else:
        raise _bad("an email needs data.text (or data.body) or data.html")
    return msg


async def send(
    deliveries: Deliveries,
    *,
    smtp_url: str | None,
    to: Any,
    cc: Any,
    sender: Any,
    subject: Any,
    text: Any,
    html: Any,
    idempotency_key: str,
    timeout_s: float,
) -> dict[str, Any]:
    """Send one email through the step's claimed delivery ``email``; return the answer."""
    to_addrs = addresses(to, "to")
    cc_addrs = addresses(cc, "cc")
    if not to_addrs:
        raise _bad("data.to rendered to no address")
    from_addrs = addresses(sender if sender not in (None, "") else DEFAULT_SENDER, "from")
    if len(from_addrs) != 1:
        raise _bad(f"data.from must be one address, not {sender!r}")
    _check_policy(from_addrs[0], len({a.addr_spec for a in (*to_addrs, *cc_addrs)}))
    msg = build_message(
        to=to_addrs,
        cc=cc_addrs,
        sender=from_addrs[0],
        subject=_as_text(subject),
        text=None if text is None else _as_text(text),
        html=None if html is None else _as_text(html),
        idempotency_key=idempotency_key,
    )
    recipients = list(dict.fromkeys(a.addr_spec for a in (*to_addrs, *cc_addrs)))

    async def dispatch() -> dict[str, Any]:
        server = _server(smtp_url)
        return await _deliver(server, msg, from_addrs[0].addr_spec, recipients, timeout_s)

    answer: dict[str, Any] = await deliveries.once(
        "email", dispatch, kind="email", target=", ".join(recipients)
    )
    return answer


def _check_policy(sender: Address, recipients: int) -> None:
    """The operator's relay sends for its tenants: only from the domains the operator names
    (LANTERN_EMAIL_FROM_DOMAINS, when set) and to at most LANTERN_EMAIL_MAX_RECIPIENTS."""
    limit = config.email_max_recipients()
    if recipients > limit:
        raise _bad(
            f"the email has {recipients} recipients; the limit is {limit}"
            " (LANTERN_EMAIL_MAX_RECIPIENTS)"
        )
    domains = config.email_from_domains()
    domain = sender.domain.lower().rstrip(".")
    if domains and domain not in domains:
        raise _bad(
            f"data.from {sender.addr_spec!r} is not of a sender domain the operator allows"
            f" ({', '.join(sorted(domains))}; LANTERN_EMAIL_FROM_DOMAINS)"
        )


def _server(smtp_url: str | None) -> SmtpServer:
    if not smtp_url:
        raise _bad(
            f"{SMTP_URL_VARIABLE} is not set: set it to smtp://HOST:PORT"
            " (smtp://USER:PASS@HOST:PORT?starttls=true for STARTTLS and login)"
        )
    try:
        return parse_smtp_url(smtp_url)
    except ValueError as exc:
        raise _bad(str(exc)) from None


async def _deliver(
    server: SmtpServer,
    msg: EmailMessage,
    sender: str,
    recipients: list[str],
    timeout_s: float,
) -> dict[str, Any]:
    where = f"the SMTP server at {server}"
    client = aiosmtplib.SMTP(
        hostname=server.host,
        port=server.port,
        username=server.username,
        password=server.password,
        use_tls=server.tls,
        start_tls=server.starttls,
        timeout=timeout_s,
    )
    try:
        async with client:
            refused, response = await _transfer(client, msg, sender, recipients)
    except aiosmtplib.SMTPRecipientsRefused as exc:
        replies = {r.recipient: f"{r.code} {r.message}" for r in exc.recipients}
        retryable = bool(exc.recipients) and all(400 <= r.code < 500 for r in exc.recipients)
        listed = "; ".join(f"{rcpt}: {reply}" for rcpt, reply in replies.items())
        raise StepError(
            f"email connector: {where} refused every recipient: {listed}",
            error_class="connector",
            retryable=retryable,
        ) from exc
    except aiosmtplib.SMTPResponseException as exc:
        raise StepError(
            f"email connector: {where} answered {exc.code} {exc.message}",
            error_class="connector",
            retryable=400 <= exc.code < 500,
        ) from exc
    except aiosmtplib.SMTPTimeoutError as exc:
        raise StepError(
            f"email connector: {where} timed out: {exc}", error_class="timeout", retryable=True
        ) from exc
    except ssl.SSLCertVerificationError as exc:
        raise StepError(
            f"email connector: {where}: its TLS certificate was refused: {exc}",
            error_class="connector",
        ) from exc
    except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPConnectError, OSError) as exc:
        raise StepError(
            f"email connector: {where}: could not deliver: {type(exc).__name__}: {exc}",
            error_class="connector",
            retryable=True,
        ) from exc
    except Exception as exc:  # SMTPNotSupported (no STARTTLS, no AUTH) and the like
        raise StepError(
            f"email connector: {where}: {type(exc).__name__}: {exc}", error_class="connector"
        ) from exc
    return {
        "messageId": str(msg["Message-ID"]),
        "accepted": [r for r in recipients if r not in refused],
        "rejected": {r: f"{reply.code} {reply.message}" for r, reply in refused.items()},
        "response": response,
    }


async def _transfer(
    client: aiosmtplib.SMTP, msg: EmailMessage, sender: str, recipients: list[str]
) -> tuple[dict[str, aiosmtplib.SMTPResponse], str]:
    """MAIL, RCPT and DATA on a connected client, as ``send_message`` does, except that headers
    are not folded at 78 characters: the Message-ID (86 with its name) stays on one line."""
    options: list[str] = []
    utf8 = not (sender + "".join(recipients)).isascii()
    if utf8:
        options.append("SMTPUTF8")  # the client refuses it when the server does not offer it
    if client.supports_extension("8BITMIME"):
        options.append("BODY=8BITMIME")
    policy = (email.policy.SMTPUTF8 if utf8 else email.policy.SMTP).clone(
        max_line_length=998,  # RFC 5322's limit; 78 is only a recommendation
        cte_type="8bit" if client.supports_extension("8BITMIME") else "7bit",
    )
    data = msg.as_bytes(policy=policy)
    return await client.sendmail(sender, recipients, data, mail_options=options)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _bad(message: str) -> StepError:
    return StepError(f"email connector: {message}", error_class="connector", retryable=False)
