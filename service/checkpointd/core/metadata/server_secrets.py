"""Random secrets shared by every replica of one database (table ``server_secrets``), such as
the key that authenticates page tokens: a token one replica issued is good on any other."""

from __future__ import annotations

import os

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import ServerSecretRow, utcnow

PAGE_TOKEN_KEY = "page-token-key"
SECRET_BYTES = 32

_secrets = ServerSecretRow.__table__


def shared_secret(db: Database, name: str) -> bytes:
    """The database's secret ``name``, made on first use. Replicas asking at once all get the
    one that was inserted first: each inserts a random value unless the row exists, then
    reads the row."""
    query = select(_secrets.c.value).where(_secrets.c.name == name)
    with db.engine.connect() as connection:
        found = connection.execute(query).scalar()
    if found is not None:
        return bytes(found)
    dialect = postgresql if db.is_postgresql else sqlite
    insert = (dialect.insert(_secrets).values(name=name, value=os.urandom(SECRET_BYTES), create_time=utcnow())
              .on_conflict_do_nothing(index_elements=["name"]))
    with db.engine.begin() as connection:
        connection.execute(insert)
        return bytes(connection.execute(query).scalar_one())
