"""Metadata: the database (engine, sessions, migrations, advisory locks), its tables, the group
commit and its row writers (SQLite, PostgreSQL), and the secrets shared by replicas.
May import: kernel."""
