"""Receipt signing keys: the key file, LANTERN_SIGNING_KEY, key ids and signatures."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lantern.config import Settings
from lantern.errors import UsageError
from lantern.receipts.keys import (
    KEY_FILE,
    b64url,
    load_ring,
    private_pem,
    rotate,
    thumbprint,
    unb64url,
    verifies,
)

# RFC 8032 §7.1 test 1 (the empty message) and its key as a JWK in RFC 8037 appendix A.
RFC_X = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
RFC_SIGNATURE = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)


def test_the_key_id_is_the_rfc_7638_thumbprint() -> None:
    # RFC 8037 A.3 gives this key's thumbprint.
    assert thumbprint(RFC_X) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_an_rfc_8032_signature_verifies_and_a_changed_one_does_not() -> None:
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": RFC_X}
    assert verifies(jwk, b"", b64url(RFC_SIGNATURE))
    assert not verifies(jwk, b"x", b64url(RFC_SIGNATURE))
    assert not verifies({**jwk, "crv": "Ed448"}, b"", b64url(RFC_SIGNATURE))
    assert not verifies(jwk, b"", b64url(RFC_SIGNATURE) + "=")  # padding is not base64url here


def test_base64url_is_strict() -> None:
    assert unb64url(b64url(b"\xff\xfe\x00")) == b"\xff\xfe\x00"
    for bad in ("a+b/", "abc=", "a"):
        with pytest.raises(ValueError):
            unb64url(bad)


def test_a_key_file_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db' / 'lantern.db'}")
    first = load_ring(settings)
    path = tmp_path / "db" / KEY_FILE  # beside the SQLite database by default
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_ring(settings).kid == first.kid  # read back, not made again
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_the_data_dir_setting_and_its_defaults(tmp_path: Path) -> None:
    env = {"LANTERN_DATA_DIR": str(tmp_path / "data")}
    assert Settings.from_env(env).data_path == tmp_path / "data"
    assert Settings.from_env({}).data_path == Path(".lantern")
    pg = Settings.from_env({"LANTERN_DATABASE_URL": "postgresql://u@h:5432/db"})
    assert pg.data_path == Path(".lantern")
    load_ring(Settings.from_env(env))
    assert (tmp_path / "data" / KEY_FILE).exists()


def test_the_signing_key_is_kept_out_of_the_settings_repr() -> None:
    pem = private_pem(Ed25519PrivateKey.generate()).decode()
    settings = Settings.from_env({"LANTERN_SIGNING_KEY": pem})
    assert "PRIVATE" not in repr(settings)


def test_several_configured_keys_the_first_signs_all_verify(tmp_path: Path) -> None:
    new, old = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    retired = Ed25519PrivateKey.generate().public_key()
    retired_pem = retired.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pem = private_pem(new) + private_pem(old) + retired_pem
    by_text = load_ring(Settings(signing_key=pem.decode(), data_dir=str(tmp_path)))
    (tmp_path / "keys.pem").write_bytes(pem)
    by_path = load_ring(Settings(signing_key=str(tmp_path / "keys.pem")))
    assert by_text.keys == by_path.keys and len(by_text.keys) == 3
    signature = by_text.sign(b"message")
    signer = by_text.keys[0].jwk()
    assert verifies(signer, b"message", signature)
    assert not any(verifies(k.jwk(), b"message", signature) for k in by_text.keys[1:])
    assert not (tmp_path / KEY_FILE).exists()  # a configured key never writes a file


EC_PEM = ec.generate_private_key(ec.SECP256R1()).private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/nonexistent/keys.pem", "cannot read /nonexistent/keys.pem"),
        (EC_PEM.decode(), "PEM block 1 (PRIVATE KEY) is not an Ed25519 key"),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "cannot be read"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not an Ed25519"),
    ],
    ids=["missing-file", "ec-key", "garbage", "certificate"],
)
def test_a_bad_configured_key_is_a_clear_error(value: str, why: str) -> None:
    with pytest.raises(UsageError) as caught:
        load_ring(Settings(signing_key=value))
    assert str(caught.value).startswith("LANTERN_SIGNING_KEY") and why in str(caught.value)


def test_rotation_puts_a_new_key_first_and_keeps_the_old(tmp_path: Path) -> None:
    settings = Settings(data_dir=str(tmp_path))
    before = load_ring(settings)
    new = rotate(settings)
    after = load_ring(settings)
    assert after.kid == new.kid != before.kid
    assert [k.kid for k in after.keys] == [new.kid, before.kid]
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
