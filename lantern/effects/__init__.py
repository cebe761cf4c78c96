"""Side effects that leave the process: http, email, webhook signing, and the claims that
make deliveries happen once."""
