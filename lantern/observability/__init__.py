"""Metrics (Prometheus) and, in their own issue, traces."""
