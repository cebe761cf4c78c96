"""Metrics (Prometheus), traces (OpenTelemetry), and the per-step hook that feeds both."""
