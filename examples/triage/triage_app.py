"""The support-triage example's tool, served with
`lantern serve --app-dir examples/triage --app triage_app:app`.

A real deployment would call a classifier or the helpdesk's API here; this one reads keywords,
so the example runs offline and gives the same answer every time.
"""

from __future__ import annotations

import lantern

app = lantern.App()

_CATEGORIES = {
    "billing": ("refund", "invoice", "charge", "payment"),
    "bug": ("error", "crash", "broken", "500"),
    "account": ("password", "login", "locked", "2fa"),
}


@app.tool("tickets.classify")
def classify(subject: str, body: str) -> dict[str, str]:
    """Label a ticket with a category and a priority."""
    text = f"{subject} {body}".lower()
    category = next(
        (name for name, words in _CATEGORIES.items() if any(w in text for w in words)), "other"
    )
    urgent = any(w in text for w in ("urgent", "asap", "down", "locked"))
    return {"category": category, "priority": "high" if urgent else "normal"}
