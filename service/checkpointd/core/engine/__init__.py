"""Engine: the application service, one module per use case (create, history, diff, rollback,
recovery) over the plan registry and locks, idempotency records and the facade ``Checkpoints``.
May import: every core package. Only the layers above the core (api, server, commands) import it."""
