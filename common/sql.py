"""The few hand-written SQL statements on the portal's hot paths, and what they need to run
on PostgreSQL and SQLite alike.

Why by hand: the ORM compiles every query anew on every call. On our 2-core machine one
simple `filter(...).first()` costs ~0.6 ms of CPU, against ~0.08 ms for the same
statement through a cursor, and a reservation create or release is a dozen of them.
Only the calls scripts make hundreds of times a second (create, release, list) and the
pool history read (tens of thousands of aggregated rows) use these; everything else stays
on the ORM. The tests run every statement on PostgreSQL,
and the embedded demo runs them on SQLite.

Two things differ between the backends and are handled here: SQLite stores datetimes as
naive UTC text (`db_datetime` adapts what we send, `aware` what we read back), and it
has no row locks (`for_update_of` is empty there: the IMMEDIATE transactions set in
settings serialize writers instead).
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from django.db import connection


def db_datetime(value: datetime | None) -> Any:
    """A datetime as the database backend wants it for a parameter (naive UTC text on SQLite)."""
    return connection.ops.adapt_datetimefield_value(value)


def aware(value: datetime | None) -> datetime | None:
    """A datetime column read by hand: PostgreSQL gives it aware; SQLite naive, in UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def instant_column(column: str) -> str:
    """A datetime column for a query that reads thousands of them (read each back with `instant`): on
    PostgreSQL as whole microseconds since the epoch, exact, because the timestamptz loader Django installs
    is Python and costs microseconds a value (a third of a queue pass went to reading its grants' windows);
    elsewhere the column itself."""
    if connection.vendor == "postgresql":
        return f"(extract(epoch from {column}) * 1000000)::bigint"
    return column


def instant(value: Any) -> datetime | None:
    """A column selected through `instant_column`, as an aware datetime."""
    if isinstance(value, int):
        return _EPOCH + timedelta(microseconds=value)
    return aware(value)


def instant_micros(value: Any) -> int:
    """A column selected through `instant_column`, as whole microseconds since the epoch (what PostgreSQL gives)."""
    if isinstance(value, int):
        return value
    return (aware(value) - _EPOCH) // timedelta(microseconds=1)


def json_value(value: Any) -> Any:
    """A JSON column read by hand: psycopg decodes jsonb already; SQLite gives the text."""
    if isinstance(value, (str, bytes)):
        return json.loads(value)
    return value


def in_list(column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """`column` among `values`, as SQL and its parameters: on PostgreSQL `column = ANY(%s)` with the values as one
    array parameter (psycopg parses a query of a thousand placeholders anew each time it runs, as a queue pass's
    row locks on its thousand waiting requests did); elsewhere `column IN (%s, ...)`."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [list(values)]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


def in_select(column: str, select: str) -> str:
    """`column` among the values a one-column `select` gives, as SQL: on PostgreSQL `column = ANY(ARRAY(select))`,
    elsewhere `column IN (select)`. The array is built once, before the outer query runs, and a GiST index cannot
    answer `= ANY(array)`, so PostgreSQL looks the values up in a btree index: as a join or `IN`, a pool's thousands
    of GPUs estimated at a few (a new pool, statistics not yet refreshed) had it probe the allocations' GiST exclusion
    index once per GPU, three times as long. (With fresh statistics on a database of one pool a hash join was ~5 ms
    quicker; on five pools, 7 ms slower: README, the pass's sixth round.)"""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(ARRAY({select}))"
    return f"{column} IN ({select})"


def for_update_of(*aliases: str) -> str:
    """` FOR UPDATE OF <aliases>` where the database has row locks, else nothing."""
    if not connection.features.has_select_for_update:
        return ""
    return " FOR UPDATE OF " + ", ".join(aliases)


def fetch_all(sql: str, params: Sequence[Any] = (), *, plan_each_time: bool = False) -> list[tuple]:
    """All rows. `plan_each_time`: on PostgreSQL never through a prepared statement, so each run is
    planned for its actual values. For a query whose best plan depends on them: a generic plan
    of the pool history read scanned the time index across the whole fleet."""
    with connection.cursor() as cursor:
        if plan_each_time and connection.vendor == "postgresql":
            cursor.cursor.execute(sql, params, prepare=False)  # psycopg's own cursor: Django's takes no options
        else:
            cursor.execute(sql, params)
        return cursor.fetchall()


def fetch_one(sql: str, params: Sequence[Any] = ()) -> tuple | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def execute(sql: str, params: Sequence[Any] = ()) -> int:
    """Run a statement; return how many rows it changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def execute_many(sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run one statement for each row of parameters (psycopg sends them together, in a pipeline)."""
    if not rows:
        return
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def values_rows(count: int, width: int) -> str:
    """`(%s, %s), (%s, %s)` for a multi-row VALUES list of `count` rows of `width` columns."""
    row = "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([row] * count)
