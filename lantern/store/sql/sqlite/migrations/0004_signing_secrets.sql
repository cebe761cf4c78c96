-- Webhook signing secrets, one per workspace. A rotated-out secret keeps signing beside its
-- successor until previous_until, so receivers can switch over without rejecting deliveries.
-- The secrets are kept in the clear: signing needs the secret itself, not a hash of it.

CREATE TABLE signing_secrets (
    workspace        TEXT PRIMARY KEY,
    secret           TEXT NOT NULL,
    created_at       REAL NOT NULL,
    previous_secret  TEXT,
    previous_until   REAL
);
