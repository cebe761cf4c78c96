"""Sealing secrets at rest, and scrubbing them out of what a step leaves behind."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from lantern.errors import UsageError
from lantern.secrets import box, redact
from lantern.secrets.box import Box, SecretUnreadable


def test_a_sealed_value_opens_only_with_its_key_workspace_and_name(tmp_path: Path) -> None:
    one = box.load(None, tmp_path)
    sealed = one.seal("alice", "TOKEN", "sk-1234567")
    assert b"sk-1234567" not in sealed
    assert one.open("alice", "TOKEN", one.key_id, sealed) == "sk-1234567"
    with pytest.raises(SecretUnreadable):
        one.open("bob", "TOKEN", one.key_id, sealed)  # copied to another workspace
    with pytest.raises(SecretUnreadable):
        one.open("alice", "OTHER", one.key_id, sealed)
    other = Box(os.urandom(32))
    with pytest.raises(SecretUnreadable, match="another key"):
        other.open("alice", "TOKEN", one.key_id, sealed)


def test_the_key_file_is_made_0600_and_refused_when_others_may_read_it(tmp_path: Path) -> None:
    first = box.load(None, tmp_path)
    path = tmp_path / box.KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert box.load(None, tmp_path).key_id == first.key_id  # the same key next time
    path.chmod(0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        box.load(None, tmp_path)


def test_the_key_setting_must_be_32_bytes(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="LANTERN_SECRETS_KEY"):
        box.load("too-short", tmp_path)
    key = box._encode(os.urandom(32))
    assert box.load(key, tmp_path).key == box.load(key + "==", tmp_path).key
    assert not (tmp_path / box.KEY_FILE).exists()  # the setting wins: no file is made


def test_a_redactor_replaces_every_spelling_of_a_value() -> None:
    scrub = redact.Redactor({"TOKEN": 'a/b c"d', "LONGER": 'a/b c"d-and-more'})
    assert scrub.text('x a/b c"d-and-more y') == "x [secret LONGER] y"
    assert scrub.text("GET /p/a%2Fb%20c%22d") == "GET /p/[secret TOKEN]"
    assert scrub.text('{"t": "a/b c\\"d"}') == '{"t": "[secret TOKEN]"}'
    assert scrub.value({'k a/b c"d': ['a/b c"d', 1]}) == {"k [secret TOKEN]": ["[secret TOKEN]", 1]}
    error = ValueError('failed at a/b c"d')
    error.__cause__ = KeyError('a/b c"d')
    assert str(scrub.exception(error)) == "failed at [secret TOKEN]" and error.__cause__ is None


def test_log_lines_are_scrubbed_of_substituted_values(caplog: pytest.LogCaptureFixture) -> None:
    redact.remember({"LOGGED": "v-logged-1234"})
    logger = logging.getLogger("lantern.test-redact")
    handler = logging.StreamHandler()
    handler.addFilter(redact.LogFilter())
    record = logger.makeRecord("x", logging.ERROR, "f", 1, "sent %s", ("v-logged-1234",), None)
    handler.filter(record)
    assert record.getMessage() == "sent [secret LOGGED]"
