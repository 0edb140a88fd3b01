"""Engine: the application service, one module per use case (create, history, bulk_delete, diff,
rollback, recovery, pending_writes, plans, contents) over the plan registry, idempotency, records.
May import: every core package. Only the layers above the core (api, server, commands) import it."""
