"""Endpoint choice (core, no I/O): snapshots (`endpoint`), filters, scorers,
pickers, the prefix index (`prefix`), the `Scheduler` placer, and the gates
built from pool metrics (`gates`)."""
