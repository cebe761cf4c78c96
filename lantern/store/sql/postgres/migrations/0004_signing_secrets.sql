-- Webhook signing secrets, one per workspace. A rotated-out secret keeps signing beside its
-- successor until previous_until, so receivers can switch over without rejecting deliveries.
-- The secrets are kept in the clear: signing needs the secret itself, not a hash of it.

CREATE TABLE signing_secrets (
    workspace        text        PRIMARY KEY,
    secret           text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    previous_secret  text,
    previous_until   timestamptz
);
