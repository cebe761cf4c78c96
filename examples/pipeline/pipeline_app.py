"""The signup pipeline's tool, served with
`lantern serve --app-dir examples/pipeline --app pipeline_app:app`.
"""

from __future__ import annotations

import hashlib

import lantern

app = lantern.App()


@app.tool("signups.normalize")
def normalize(email: str, name: str, plan: str = "free") -> dict[str, str]:
    """Clean the signup up and give it a stable account id (the same signup, the same id)."""
    clean = email.strip().lower()
    account = "acct_" + hashlib.sha256(clean.encode()).hexdigest()[:12]
    return {"account": account, "email": clean, "name": name.strip(), "plan": plan}
