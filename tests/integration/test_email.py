"""The email connector against a real SMTP server (aiosmtpd on 127.0.0.1), on both backends:
rendering, headers, the Message-ID derived from the idempotency key, the claimed and recorded
receipt, SMTP answers mapped to retryable or not, STARTTLS and login.

``SmtpSink`` is also what the crash tests (tests/crash/test_email_crash.py) deliver to.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import hashlib
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

import lantern
from lantern.effects.email import parse_smtp_url
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import Append, Store
from lantern.store.records import Run
from tests.server import free_port


@dataclass(frozen=True)
class Mail:
    sender: str
    recipients: tuple[str, ...]
    message: EmailMessage
    login: str | None  # the user that logged in, if one did
    tls: bool  # whether the session had switched to TLS

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])


class SmtpSink:
    """A real SMTP server that keeps every message it accepts.

    ``refuse[address] = "550 no such user"`` answers RCPT TO for that address with the reply;
    ``data_reply`` answers DATA. ``hold(subject)`` keeps the DATA of messages with that subject
    unanswered (the message already recorded: it went out) until ``release()``.
    """

    def __init__(self, **smtp_options: Any) -> None:
        self.mails: list[Mail] = []
        self.refuse: dict[str, str] = {}
        self.data_reply: str | None = None
        self.arrived = threading.Event()  # a held message has arrived
        self._held: str | None = None
        self._release = threading.Event()
        self._lock = threading.Lock()
        self.port = free_port()
        self.controller = Controller(
            self, hostname="127.0.0.1", port=self.port, server_hostname="sink.test", **smtp_options
        )

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def start(self) -> SmtpSink:
        self.controller.start()
        return self

    def close(self) -> None:
        self.release()
        self.controller.stop()

    def hold(self, subject: str) -> None:
        self._held = subject
        self._release.clear()
        self.arrived.clear()

    def release(self) -> None:
        self._held = None
        self._release.set()

    def received(self, subject: str | None = None) -> list[Mail]:
        with self._lock:
            return [m for m in self.mails if subject is None or m.subject == subject]

    # aiosmtpd's handler hooks

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        reply = self.refuse.get(address)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        mail = Mail(
            sender=str(envelope.mail_from),
            recipients=tuple(envelope.rcpt_tos),
            message=message,
            login=session.auth_data if session.authenticated else None,
            tls=session.ssl is not None,
        )
        with self._lock:
            self.mails.append(mail)
        if self._held is not None and mail.subject == self._held:
            self.arrived.set()
            await asyncio.to_thread(self._release.wait, 60)
        return self.data_reply or "250 2.0.0 queued as lantern-test"


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpSink]:
    sink = SmtpSink().start()
    monkeypatch.setenv("LANTERN_SMTP_URL", sink.url)
    yield sink
    sink.close()


def key_of(run_id: str, step_id: str, attempt: int = 1) -> str:
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()


def mail_agent(name: str, **data: Any) -> dict[str, Any]:
    fields = {"connector": "email", "to": "{{ input.email }}", "subject": "Hi", "text": "Hello"}
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "mail", "type": "connector", "data": {**fields, **data}},
            ],
            "edges": [{"source": "start", "target": "mail"}],
        },
    }


async def drive(store: Store, run_id: str, app: lantern.App | None = None) -> Run:
    async with Worker(store, app or lantern.App(), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        run = await w.runner.drive(run_id)
    assert run is not None
    return run


async def start_run(store: Store, definition: dict[str, Any], input: Any) -> Run:
    await apply_agent(store, definition)
    return await create_run(store, definition["name"], input)


WELCOME = mail_agent(
    "welcome",
    to="{{ input.email }}",
    cc=["Boss <boss@example.test>"],
    **{"from": "Lantern <noreply@example.test>"},
    subject="Welcome, {{ input.name }}",
    text="Hello {{ input.name }}, your order {{ input.order }} shipped.",
    html="<p>Hello <b>{{ input.name }}</b></p>",
)


async def test_an_email_step_sends_its_rendered_message_once_and_records_the_receipt(
    store: Store, smtp: SmtpSink
) -> None:
    run = await start_run(store, WELCOME, {"email": "ada@example.test", "name": "Ada", "order": 7})
    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error

    key = key_of(run.id, "mail")
    [mail] = smtp.received()
    assert mail.message_id == f"<{key}@lantern>"
    assert mail.message["Idempotency-Key"] == key
    assert mail.recipients == ("ada@example.test", "boss@example.test")
    assert mail.sender == "noreply@example.test"
    assert mail.message["From"] == "Lantern <noreply@example.test>"
    assert mail.message["To"] == "ada@example.test"
    assert mail.message["Cc"] == "Boss <boss@example.test>"
    assert mail.subject == "Welcome, Ada"
    assert mail.message["Date"] is not None
    assert mail.message.get_content_type() == "multipart/alternative"
    plain = mail.message.get_body(("plain",))
    html = mail.message.get_body(("html",))
    assert plain is not None and html is not None
    assert plain.get_content().strip() == "Hello Ada, your order 7 shipped."
    assert html.get_content().strip() == "<p>Hello <b>Ada</b></p>"

    assert done.output == {
        "messageId": f"<{key}@lantern>",
        "accepted": ["ada@example.test", "boss@example.test"],
        "rejected": {},
        "response": "2.0.0 queued as lantern-test",
    }
    [receipt] = await store.deliveries(run.id)
    assert (receipt.step_id, receipt.name, receipt.kind) == ("mail", "email", "email")
    assert receipt.status == "delivered"
    assert receipt.idempotency_key == key
    assert receipt.target == "ada@example.test, boss@example.test"
    assert receipt.response == done.output

    # Re-driving the finished run sends nothing and records nothing.
    again = await drive(store, run.id)
    assert again.status == "succeeded" and again.output == done.output
    assert len(smtp.received()) == 1
    assert await store.deliveries(run.id) == [receipt]


async def test_html_alone_and_a_list_of_recipients(store: Store, smtp: SmtpSink) -> None:
    definition = mail_agent(
        "html-only", to="{{ input.team }}", text=None, html="<h1>{{ input.title }}</h1>"
    )
    del definition["graph"]["nodes"][1]["data"]["text"]
    run = await start_run(
        store, definition, {"team": ["a@example.test", "b@example.test"], "title": "Hi"}
    )
    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error
    [mail] = smtp.received()
    assert mail.recipients == ("a@example.test", "b@example.test")
    assert mail.sender == "lantern@localhost"  # no data.from: the default sender
    assert mail.message.get_content_type() == "text/html"
    assert mail.message.get_content().strip() == "<h1>Hi</h1>"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_non_ascii_names_subjects_and_bodies_arrive_intact(
    store: Store, smtp: SmtpSink
) -> None:
    definition = mail_agent(
        "unicode",
        to="{{ input.name }} <zoe@example.test>",
        subject="Grüße, {{ input.name }} " + "—" * 40,  # long enough to need folding
        text="Héllo {{ input.name }} ✓",
        html="<p>Héllo {{ input.name }}</p>",
    )
    run = await start_run(store, definition, {"name": "Zoë"})
    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error
    [mail] = smtp.received()
    assert mail.subject == "Grüße, Zoë " + "—" * 40
    assert mail.message["To"] == "Zoë <zoe@example.test>"
    plain = mail.message.get_body(("plain",))
    assert plain is not None and plain.get_content().strip() == "Héllo Zoë ✓"
    assert mail.message_id == f"<{key_of(run.id, 'mail')}@lantern>"


class SimulatedCrash(BaseException):
    """Not an Exception: nothing in the engine catches it, as nothing survives a SIGKILL."""


async def test_a_crash_after_the_receipt_was_recorded_does_not_send_again(
    store: Store, smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await start_run(store, mail_agent("m1"), {"email": "ada@example.test"})
    real_append = store.append

    async def append_then_die(batch: Append) -> None:
        if any(e.kind == "step_completed" and e.step_id == "mail" for e in batch.events):
            raise SimulatedCrash  # the receipt is recorded; the step's completion never is
        await real_append(batch)

    monkeypatch.setattr(store, "append", append_then_die)
    with pytest.raises(SimulatedCrash):
        await drive(store, run.id)
    monkeypatch.setattr(store, "append", real_append)
    [receipt] = await store.deliveries(run.id)
    assert receipt.status == "delivered"
    completed = [e.step_id for e in await store.events(run.id) if e.kind == "step_completed"]
    assert completed == ["start"]

    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error
    assert len(smtp.received()) == 1  # the re-drive found the receipt and sent nothing
    assert done.output == receipt.response
    completed = [e.step_id for e in await store.events(run.id) if e.kind == "step_completed"]
    assert completed == ["start", "mail"]


async def test_a_crash_before_the_outcome_was_recorded_resends_with_the_same_message_id(
    store: Store, smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await start_run(store, mail_agent("m2"), {"email": "ada@example.test"})
    real_finish = store.finish_delivery

    async def die(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash  # the message went out; its outcome is never recorded

    monkeypatch.setattr(store, "finish_delivery", die)
    with pytest.raises(SimulatedCrash):
        await drive(store, run.id)
    monkeypatch.setattr(store, "finish_delivery", real_finish)
    [claimed] = await store.deliveries(run.id)
    assert claimed.status == "claimed"

    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error
    first, second = smtp.received()
    assert first.message_id == second.message_id == f"<{key_of(run.id, 'mail')}@lantern>"
    [receipt] = await store.deliveries(run.id)
    assert receipt.status == "delivered" and receipt.response == done.output


async def failed_delivery(store: Store, name: str, input: Any, **data: Any) -> dict[str, Any]:
    """Run a one-email agent that fails; check the receipt recorded the failure; the error."""
    run = await start_run(store, mail_agent(name, **data), input)
    done = await drive(store, run.id)
    assert done.status == "failed"
    error: dict[str, Any] = done.error
    assert error["code"] == "step_failed" and error["step"] == "mail"
    [receipt] = await store.deliveries(run.id)
    assert receipt.status == "failed"
    assert receipt.response["message"] == error["message"]
    failed = [e for e in await store.events(run.id) if e.kind == "step_failed"]
    assert [e.step_id for e in failed] == ["mail"]
    return error


@pytest.mark.parametrize(
    ("stage", "reply", "retryable"),
    [
        ("rcpt", "550 5.1.1 no such user", False),
        ("rcpt", "451 4.7.1 greylisted, try again later", True),
        ("data", "554 5.7.1 message rejected as spam", False),
        ("data", "452 4.3.1 insufficient system storage", True),
    ],
)
async def test_smtp_4xx_answers_are_retryable_and_5xx_are_not(
    store: Store, smtp: SmtpSink, stage: str, reply: str, retryable: bool
) -> None:
    if stage == "rcpt":
        smtp.refuse["nobody@example.test"] = reply
    else:
        smtp.data_reply = reply
    error = await failed_delivery(store, "refused", {"email": "nobody@example.test"})
    assert error["class"] == "connector"
    assert error["retryable"] is retryable
    assert reply in error["message"]  # the server's own words
    if stage == "rcpt":
        assert smtp.received() == []


async def test_a_recipient_refused_among_accepted_ones_is_listed_and_the_rest_get_it(
    store: Store, smtp: SmtpSink
) -> None:
    smtp.refuse["nobody@example.test"] = "550 5.1.1 no such user"
    run = await start_run(
        store,
        mail_agent("partly", to=["ada@example.test", "nobody@example.test"]),
        {},
    )
    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error
    assert done.output["accepted"] == ["ada@example.test"]
    assert done.output["rejected"] == {"nobody@example.test": "550 5.1.1 no such user"}
    [mail] = smtp.received()
    assert mail.recipients == ("ada@example.test",)
    assert mail.message["To"] == "ada@example.test, nobody@example.test"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_without_lantern_smtp_url_an_email_step_fails_naming_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LANTERN_SMTP_URL", raising=False)
    error = await failed_delivery(store, "nourl", {"email": "ada@example.test"})
    assert error["class"] == "connector" and error["retryable"] is False
    assert "LANTERN_SMTP_URL is not set" in error["message"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_server_that_does_not_answer_is_a_retryable_connector_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANTERN_SMTP_URL", f"smtp://127.0.0.1:{free_port()}")  # nobody there
    error = await failed_delivery(store, "down", {"email": "ada@example.test"})
    assert error["class"] == "connector" and error["retryable"] is True
    assert "could not deliver" in error["message"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_bad_rendered_address_fails_before_anything_is_claimed(
    store: Store, smtp: SmtpSink
) -> None:
    run = await start_run(store, mail_agent("badaddr"), {"email": "ada@example.test\r\nBcc: x@y"})
    done = await drive(store, run.id)
    assert done.status == "failed"
    assert done.error["class"] == "connector" and done.error["retryable"] is False
    assert "line break" in done.error["message"]
    assert await store.deliveries(run.id) == [] and smtp.received() == []


# ---------------------------------------------------------------- STARTTLS and login


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1, made with the openssl command."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ),
            *(
                "-days",
                "2",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def authenticator(user: str, password: str) -> Callable[..., AuthResult]:
    def check(
        server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            user.encode(),
            password.encode(),
        )
        return AuthResult(success=ok, auth_data=user if ok else None, handled=False)

    return check


@pytest.fixture
def tls_smtp(certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpSink]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    sink = SmtpSink(
        tls_context=context,
        require_starttls=True,
        authenticator=authenticator("ada", "p@ss word"),
        auth_required=True,
    ).start()
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # the client trusts it
    yield sink
    sink.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_starttls_and_login_when_the_url_asks_for_them(
    store: Store, tls_smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "LANTERN_SMTP_URL", f"smtp://ada:p%40ss%20word@127.0.0.1:{tls_smtp.port}?starttls=true"
    )
    run = await start_run(store, mail_agent("tls"), {"email": "ada@example.test"})
    done = await drive(store, run.id)
    assert done.status == "succeeded", done.error
    [mail] = tls_smtp.received()
    assert mail.tls and mail.login == "ada"
    assert mail.message_id == f"<{key_of(run.id, 'mail')}@lantern>"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_wrong_password_is_a_5xx_and_not_retryable(
    store: Store, tls_smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "LANTERN_SMTP_URL", f"smtp://ada:guess@127.0.0.1:{tls_smtp.port}?starttls=true"
    )
    error = await failed_delivery(store, "badpass", {"email": "ada@example.test"})
    assert error["class"] == "connector" and error["retryable"] is False
    assert "535" in error["message"] and "guess" not in error["message"]
    assert tls_smtp.received() == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_plain_smtp_to_a_server_that_requires_starttls_fails_clearly(
    store: Store, tls_smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANTERN_SMTP_URL", f"smtp://127.0.0.1:{tls_smtp.port}")
    error = await failed_delivery(store, "plain", {"email": "ada@example.test"})
    assert error["class"] == "connector" and error["retryable"] is False
    assert "530" in error["message"]  # the server's "must issue a STARTTLS command first"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_an_untrusted_certificate_is_refused_and_not_retried(
    store: Store, tls_smtp: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE")  # the system's trust store: the sink is self-signed
    monkeypatch.setenv("LANTERN_SMTP_URL", f"smtp://127.0.0.1:{tls_smtp.port}?starttls=true")
    error = await failed_delivery(store, "untrusted", {"email": "ada@example.test"})
    assert error["class"] == "connector" and error["retryable"] is False
    assert "certificate" in error["message"]
    assert tls_smtp.received() == []


# ---------------------------------------------------------------- LANTERN_SMTP_URL


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("smtp://mail.test", ("mail.test", 25, None, None, False, False)),
        ("smtp://mail.test:2525", ("mail.test", 2525, None, None, False, False)),
        ("smtp://u:p%40w@mail.test?starttls=true", ("mail.test", 587, "u", "p@w", True, False)),
        ("smtp://u:pw@mail.test:25?starttls=false", ("mail.test", 25, "u", "pw", False, False)),
        ("smtps://u:pw@mail.test", ("mail.test", 465, "u", "pw", False, True)),
    ],
)
def test_smtp_urls(url: str, expected: tuple[Any, ...]) -> None:
    s = parse_smtp_url(url)
    assert (s.host, s.port, s.username, s.password, s.starttls, s.tls) == expected
    assert "p@w" not in str(s) and "pw" not in str(s).split("@")[0].split(":")[-1]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://mail.test", "must start with smtp:// or smtps://"),
        ("smtp://", "names no host"),
        ("smtp://mail.test/inbox", "takes no path"),
        ("smtp://mail.test?tls=1", "unknown parameter 'tls'"),
        ("smtp://mail.test?starttls=maybe", "starttls must be true or false"),
        ("smtps://mail.test?starttls=true", "smtps:// is TLS already"),
        ("smtp://u:secret@mail.test:port", "is not a URL"),
    ],
)
def test_bad_smtp_urls_are_refused_without_quoting_the_password(url: str, expected: str) -> None:
    with pytest.raises(ValueError, match="LANTERN_SMTP_URL") as info:
        parse_smtp_url(url)
    assert expected in str(info.value) and "secret" not in str(info.value)
