"""The scheduler's HTTP endpoint (/healthz, /readyz, /metrics) and its metrics."""
