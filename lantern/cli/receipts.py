"""`lantern receipt verify|keys|rotate-key` and `lantern runs export`: signed receipts.

A RUN_ID is read over the API when LANTERN_URL and LANTERN_API_KEY are set, otherwise from the
database (issuing the receipt if the finished run has none yet). Keys come from ``--keys`` (a
JWK set file or URL), else from the same place as the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from lantern.cli.common import fail, opened, remote, run, settings, with_database
from lantern.config import Settings
from lantern.errors import LanternError

DATABASE = click.option("--database-url", help="Overrides LANTERN_DATABASE_URL.")


class ReceiptInvalid(LanternError):
    pass


@click.group("receipt")
def receipt() -> None:
    """Signed receipts of finished runs (docs/receipts.md)."""


@receipt.command("verify")
@click.argument("target", metavar="RUN_ID|FILE")
@click.option("--keys", "keys_from", metavar="FILE_OR_URL", help="A JWK set file or URL.")
@DATABASE
@click.pass_context
def verify_command(
    ctx: click.Context, target: str, keys_from: str | None, database_url: str | None
) -> None:
    """Check a receipt's Ed25519 signature and the journal it was signed over.

    FILE is an export (`lantern runs export`). Exit 1 naming every check that fails.
    """
    with_database(ctx, database_url)
    s = settings(ctx)

    # Files and --keys are read before the event loop starts (no blocking calls inside it).
    exported = _read_export(target)
    given = None if keys_from is None else _read_keys(keys_from)

    async def body() -> None:
        from lantern.receipts.verify import verify

        doc, keys = await _gather(s, target, exported, server_keys=given is None)
        failures = verify(doc, keys if given is None else given)
        if failures:
            for failure in failures:
                click.echo(f"FAILED: {failure}", err=True)
            raise ReceiptInvalid(f"the receipt does not verify ({len(failures)} failed checks)")
        r = doc["receipt"]
        click.echo(
            f"receipt verified: run {r.get('runId')} {r.get('status')},"
            f" {r.get('eventCount')} events, journal head {r.get('journalHead')},"
            f" signed by key {r.get('keyId')}"
        )

    run(body)


@receipt.command("keys")
@DATABASE
@click.pass_context
def keys_command(ctx: click.Context, database_url: str | None) -> None:
    """Print the public keys that verify receipts, as a JWK set."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        click.echo(json.dumps({"keys": await _server_keys(s)}, indent=2))

    run(body)


@receipt.command("rotate-key")
@DATABASE
@click.pass_context
def rotate_command(ctx: click.Context, database_url: str | None) -> None:
    """Put a new signing key first in the data directory's key file (old keys keep verifying).
    Servers sign with it from their next start."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> None:
        from lantern.receipts import keys as signing

        key = signing.rotate(s)
        async with opened(s) as store:
            await store.register_signing_key(key.kid, key.x)
        click.echo(f"new signing key {key.kid} in {signing.key_file(s)}")

    run(body)


@click.command("export")
@click.argument("run_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path))
@DATABASE
@click.pass_context
def export_command(
    ctx: click.Context, run_id: str, output: Path | None, database_url: str | None
) -> None:
    """Write a finished run's events and signed receipt as one JSON document."""
    with_database(ctx, database_url)
    s = settings(ctx)

    async def body() -> dict[str, Any]:
        from lantern.receipts.export import local_export, remote_export
        from lantern.receipts.issue import open_issuer

        api = remote()
        if api is not None:
            async with api:
                return await remote_export(api, run_id)
        async with opened(s) as store:
            return await local_export(store, await open_issuer(s, store), run_id)

    doc = run(body)
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    output.write_text(text)
    click.echo(f"wrote {output}: {len(doc['events'])} events and the receipt", err=True)


def _read_export(target: str) -> Any:
    """The export in FILE, or None when TARGET is not a file (so it is a run id)."""
    path = Path(target)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"{target} is not a JSON export: {exc}", 2)


async def _gather(
    s: Settings, target: str, exported: Any, *, server_keys: bool
) -> tuple[Any, list[Any]]:
    """The export to verify (``exported``, or the run's) and, with ``server_keys``, the keys
    of the server or database it came from."""
    from lantern.receipts import keys as signing
    from lantern.receipts.export import local_export, remote_export
    from lantern.receipts.issue import open_issuer

    if exported is not None:
        return exported, await _server_keys(s) if server_keys else []
    api = remote()
    if api is not None:
        async with api:
            doc = await remote_export(api, target)
            return doc, await api.receipt_keys() if server_keys else []
    async with opened(s) as store:
        doc = await local_export(store, await open_issuer(s, store), target)
        found = await store.signing_keys() if server_keys else []
    return doc, [signing.PublicKey(k.kid, k.x).jwk() for k in found]


def _read_keys(keys_from: str) -> list[Any]:
    """A JWK set (or one JWK) from a file or an http(s) URL; exit 2 when it is not one."""
    import httpx

    try:
        if keys_from.startswith(("http://", "https://")):
            response = httpx.get(keys_from, timeout=30)
            response.raise_for_status()
            found = response.json()
        else:
            found = json.loads(Path(keys_from).read_text())
    except (httpx.HTTPError, OSError, ValueError) as exc:
        fail(f"--keys {keys_from}: cannot read a JWK set: {exc}", 2)
    if isinstance(found, dict) and isinstance(found.get("keys"), list):
        return list(found["keys"])
    if isinstance(found, dict) and "kty" in found:
        return [found]  # a single JWK
    fail(f"--keys {keys_from}: not a JWK set ({{'keys': [...]}})", 2)
    raise AssertionError("unreachable")


async def _server_keys(s: Settings) -> list[Any]:
    from lantern.receipts import keys as signing

    api = remote()
    if api is not None:
        async with api:
            return await api.receipt_keys()
    async with opened(s) as store:
        return [signing.PublicKey(k.kid, k.x).jwk() for k in await store.signing_keys()]
