"""The ``lantern`` command line."""
