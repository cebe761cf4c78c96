"""The microVM tier (CONTRACT §11): drivers, runtime nodes, the scheduler and the relay.

The engine never imports this package; the server wires it in.
"""
