"""Side effects that leave the process: http requests (email and claims in later issues)."""
