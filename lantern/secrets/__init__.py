"""A workspace's secrets (docs/security.md): sealed at rest (box), kept per workspace (vault),
substituted into a step's templates only when it dispatches, and scrubbed from everything the
step leaves behind (redact)."""
