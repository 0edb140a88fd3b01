"""Engine: the application service, one module per use case (create, history, bulk_delete, diff,
rollback, recovery, pending_writes) over the plan registry and locks, idempotency, records.
May import: every core package. Only the layers above the core (api, server, commands) import it."""
