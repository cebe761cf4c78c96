"""The microVM tier (docs/runtime.md): drivers, runtime nodes, the scheduler and the relay.

The engine never imports this package; the server wires it in.
"""
