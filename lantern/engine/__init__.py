"""The durable engine: journal, replay gate, interpreter, runner, leases and workers."""
