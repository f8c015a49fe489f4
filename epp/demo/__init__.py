"""The live demo: simulated model servers over HTTP, a load generator,
a real Envoy and `epp serve`, all on loopback."""
