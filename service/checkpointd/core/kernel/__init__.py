"""Kernel: domain errors and reasons, cancellation tokens, closed vocabularies, field validation, fault points,
telemetry events and the garbage-collector settings every other package shares.
May import: nothing of checkpointd (the standard library only)."""
