"""What a runtime node may share with its VMs as ``/app``: never its own data.

A node started in a project folder with ``--app .`` would otherwise give every VM the SQLite
database, the key that decrypts every workspace's secrets and the receipt signing keys (all
under ``.lantern/`` by default). An app directory that holds any of them is refused.
"""

from __future__ import annotations

from pathlib import Path

from lantern.receipts.keys import KEY_FILE as SIGNING_KEYS
from lantern.secrets.box import KEY_FILE as SECRETS_KEY


def private_paths(data_path: Path, database_url: str) -> list[Path]:
    """The node's own files and folders, whether they exist yet or not."""
    found = [data_path, data_path / SECRETS_KEY, data_path / SIGNING_KEYS, Path(".lantern")]
    if database_url.startswith("sqlite:///"):
        db = database_url.removeprefix("sqlite:///").split("?", 1)[0]
        if db not in ("", ":memory:"):
            found.append(Path(db))
    return found


def shares_private(app_dir: Path, data_path: Path, database_url: str) -> str | None:
    """Why ``app_dir`` must not be shared with VMs (one line), or None."""
    app = app_dir.resolve()
    for path in private_paths(data_path, database_url):
        full = path.resolve()
        if full == app or app in full.parents:
            return (
                f"--app {app_dir} holds the node's own {full} (its data folder, database or "
                "keys): give the folder of the app's code alone"
            )
    return None
