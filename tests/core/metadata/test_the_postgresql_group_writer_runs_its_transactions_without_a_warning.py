"""The PostgreSQL group writer opens each transaction with its own BEGIN on a connection in
autocommit mode. On a connection that opened a transaction by itself, that BEGIN would make the
server warn "there is already a transaction in progress" for every group commit: a WARNING in
PostgreSQL's log per checkpoint. The notices the server sends the writer's connection show it."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, String, Table, select

from checkpointd.core.metadata.db import Database

_metadata = MetaData()
_ITEMS = Table("quiet_items", _metadata, Column("key", String, primary_key=True), Column("n", Integer))
_COUNTERS = Table("quiet_counters", _metadata, Column("name", String, primary_key=True), Column("value", Integer))


def test_group_commits_on_postgresql_draw_no_warning_from_the_server(postgres):
    url = postgres.create()
    database = Database(url)
    try:
        _metadata.create_all(database.engine)
        with database.engine.begin() as connection:
            connection.execute(_COUNTERS.insert(), [{"name": "groups", "value": 0}])

        def write(rows, keys) -> None:
            (value, _), = rows.increment(_COUNTERS.c.value, _COUNTERS.c.name, ["groups"]).values()
            rows.insert(_ITEMS, [{"key": key, "n": value} for key in keys])

        queue = database.group_commit(write)
        queue.submit("first")  # opens the writer's connection
        notices: list[str] = []
        database._writer._driver.add_notice_handler(
            lambda notice: notices.append(f"{notice.severity}: {notice.message_primary}"))
        for key in ("second", "third"):
            queue.submit(key)

        assert notices == []
        with database.engine.connect() as connection:
            assert dict(connection.execute(select(_ITEMS.c.key, _ITEMS.c.n)).all()) == {
                "first": 1, "second": 2, "third": 3}
    finally:
        database.dispose()
        postgres.drop(url)
