"""What an operator sees of a running hub: Prometheus metrics, OpenTelemetry traces, logs."""
