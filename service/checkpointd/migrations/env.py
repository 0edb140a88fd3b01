"""Alembic environment: migrates on the connection ``Database.migrate`` hands over, inside
the transaction it already opened (and, on PostgreSQL, under its advisory lock)."""

from alembic import context
from sqlmodel import SQLModel

from checkpointd.core.metadata import models  # noqa: F401 - registers the tables
from checkpointd.core.metadata.db import SCHEMA_VERSION_TABLE

if context.is_offline_mode():
    raise RuntimeError("checkpointd migrations run online only: start the server, or call Database.migrate()")

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    version_table=SCHEMA_VERSION_TABLE,
    # SQLite alters a table by copying it into a new one.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
