"""Alembic migrations of the metadata schema (run by ``Database.migrate``; no alembic.ini)."""
