"""Which app directories a runtime node refuses to share (the CLI's one line:
tests/runtime/test_node_files.py)."""

from __future__ import annotations

from pathlib import Path

from lantern.cli.appdir import shares_private


def test_an_app_dir_holding_the_data_folder_or_a_key_is_refused(tmp_path: Path) -> None:
    data, app = tmp_path / "app" / "data", tmp_path / "app"
    sqlite = f"sqlite:///{tmp_path / 'db' / 'lantern.db'}"
    assert shares_private(app, data, sqlite) is not None  # the data folder inside
    assert shares_private(data, data, sqlite) is not None  # the data folder itself
    assert shares_private(app, tmp_path / "keys", f"sqlite:///{app / 'x.db'}") is not None
    assert shares_private(tmp_path, tmp_path / "keys", "postgresql://h/db") is not None
    assert shares_private(app / "code", tmp_path / "keys", "postgresql://h/db") is None
    assert shares_private(tmp_path / "db", tmp_path / "keys", sqlite) is not None
