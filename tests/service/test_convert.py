"""Conversions done on every reply agree with the protobuf library's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf import timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from checkpointd.api.convert import timestamp

ZONES = st.one_of(st.none(), st.just(UTC),
                  st.integers(-23 * 60, 23 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes))))


def library_timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    converted = timestamp_pb2.Timestamp()
    converted.FromDatetime(value)
    return converted


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)), ZONES)
def test_timestamp_is_what_from_datetime_gives(moment, zone):
    value = moment if zone is None else moment.replace(tzinfo=zone)
    assert timestamp(value) == library_timestamp(value)


def test_a_naive_time_is_utc_and_before_1970_keeps_nanos_positive():
    before_epoch = datetime(1969, 12, 31, 23, 59, 59, 250000)
    assert timestamp(before_epoch) == timestamp_pb2.Timestamp(seconds=-1, nanos=250_000_000)
    assert timestamp(before_epoch.replace(tzinfo=UTC)) == timestamp(before_epoch)
