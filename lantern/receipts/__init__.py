"""Signed receipts of finished runs: keys (``keys``), issuing (``issue``), the export a third
party verifies (``export``) and the verification itself (``verify``). docs/receipts.md has the
format and the steps."""
