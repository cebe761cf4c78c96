"""Webhook signing secrets, receipt signing keys, and the receipts they sign."""

from __future__ import annotations

from collections.abc import Sequence

from lantern.store.postgres.connection import PostgresConnection
from lantern.store.records import SigningKey, StoredReceipt


class Signing(PostgresConnection):
    # -- webhook signing secrets ------------------------------------------------------

    async def signing_secrets(self, workspace: str) -> list[str]:
        row = await self._fetchone(
            "SELECT secret, CASE WHEN previous_until > now() THEN previous_secret END"
            " FROM signing_secrets WHERE workspace = %s",
            (workspace,),
        )
        return [] if row is None else [s for s in row if s is not None]

    async def ensure_signing_secret(self, workspace: str, secret: str) -> str:
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO signing_secrets (workspace, secret) VALUES (%s, %s)"
                " ON CONFLICT (workspace) DO NOTHING",
                (workspace, secret),
            )
            # A statement of its own: its snapshot sees a row a concurrent first use committed.
            cur = await conn.execute(
                "SELECT secret FROM signing_secrets WHERE workspace = %s", (workspace,)
            )
            row = await cur.fetchone()
        assert row is not None
        return str(row[0])

    async def rotate_signing_secret(self, workspace: str, secret: str, overlap_s: float) -> None:
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO signing_secrets (workspace, secret) VALUES (%(ws)s, %(secret)s)"
                " ON CONFLICT (workspace) DO UPDATE SET secret = excluded.secret,"
                " created_at = now(),"
                " previous_secret = CASE WHEN %(keep)s THEN signing_secrets.secret END,"
                " previous_until = CASE WHEN %(keep)s"
                "  THEN now() + make_interval(secs => %(overlap)s) END",
                {
                    "ws": workspace,
                    "secret": secret,
                    "keep": overlap_s > 0,
                    "overlap": float(overlap_s),
                },
            )

    # -- receipts ---------------------------------------------------------------------

    async def journal_head(self, run_id: str) -> tuple[int, str | None]:
        row = await self._fetchone(
            "SELECT COUNT(*), (SELECT hash FROM journal_events WHERE run_id = %(run)s"
            " ORDER BY seq DESC LIMIT 1) FROM journal_events WHERE run_id = %(run)s",
            {"run": run_id},
        )
        assert row is not None
        return int(row[0]), row[1]

    async def journal_heads(self, run_ids: Sequence[str]) -> dict[str, tuple[int, str | None]]:
        heads: dict[str, tuple[int, str | None]] = dict.fromkeys(run_ids, (0, None))
        if not run_ids:
            return heads
        rows = await self._fetchall(
            "SELECT run_id, count(*), (SELECT hash FROM journal_events l"
            " WHERE l.run_id = j.run_id ORDER BY seq DESC LIMIT 1)"
            " FROM journal_events j WHERE run_id = ANY(%s) GROUP BY run_id",
            (list(run_ids),),
        )
        for run_id, count, head in rows:
            heads[run_id] = (int(count), head)
        return heads

    async def register_signing_key(self, kid: str, x: str) -> None:
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO signing_keys (kid, x) VALUES (%s, %s) ON CONFLICT (kid) DO NOTHING",
                (kid, x),
            )

    async def signing_keys(self) -> list[SigningKey]:
        rows = await self._fetchall(
            "SELECT kid, x, created_at FROM signing_keys ORDER BY created_at, kid"
        )
        return [SigningKey(*r) for r in rows]

    async def put_receipt(self, receipt: StoredReceipt) -> StoredReceipt:
        r = receipt
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO receipts (run_id, key_id, body, signature) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (run_id) DO NOTHING",
                (r.run_id, r.key_id, r.body, r.signature),
            )
            # A statement of its own: its snapshot sees a receipt a concurrent issuer committed.
            cur = await conn.execute(
                "SELECT run_id, key_id, body, signature, created_at FROM receipts"
                " WHERE run_id = %s",
                (r.run_id,),
            )
            row = await cur.fetchone()
        assert row is not None
        return StoredReceipt(*row)

    async def put_receipts(self, receipts: Sequence[StoredReceipt]) -> None:
        if not receipts:
            return
        async with self._connection() as conn, conn.transaction():
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO receipts (run_id, key_id, body, signature)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                    [(r.run_id, r.key_id, r.body, r.signature) for r in receipts],
                )

    async def get_receipt(self, run_id: str) -> StoredReceipt | None:
        row = await self._fetchone(
            "SELECT run_id, key_id, body, signature, created_at FROM receipts WHERE run_id = %s",
            (run_id,),
        )
        return None if row is None else StoredReceipt(*row)
