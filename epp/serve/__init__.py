"""The live shell: `epp serve` wiring, admission, health, metrics, file inputs, TLS."""
