"""ULID fields are checked by pattern; the pattern accepts exactly what python-ulid parses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ulid import ULID

from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import InvalidArgument, Reason

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: Crockford letters of both cases, the letters Crockford leaves out, and a few others.
NEAR_ULID = CROCKFORD + CROCKFORD.lower() + "ILOUilou-_ é\u0661"


def parses_as_ulid(value: str) -> bool:
    try:
        ULID.from_str(value)
    except ValueError:
        return False
    return True


def accepted(value: str) -> bool:
    try:
        validation.plan_id(value)
    except InvalidArgument as error:
        assert error.reason is Reason.INVALID_PLAN_ID
        return False
    return True


@given(st.text(alphabet=NEAR_ULID, min_size=24, max_size=28))
def test_a_ulid_is_accepted_exactly_when_python_ulid_parses_it(value):
    assert accepted(value) == parses_as_ulid(value)


@given(st.builds(lambda ulid, lower: str(ulid).lower() if lower else str(ulid), st.builds(ULID), st.booleans()))
def test_every_generated_ulid_is_accepted_and_upper_cased(value):
    assert validation.plan_id(value) == value.upper()


@pytest.mark.parametrize("value", [
    "8" + "0" * 25,            # beyond 128 bits
    "0" * 25,                  # too short
    "0" * 27,                  # too long
    "0" * 25 + "U",            # not a Crockford letter
    "0" * 25 + "\u0661",       # a digit, but not an ASCII one
    "0" * 25 + "\n",
])
def test_near_misses_are_refused(value):
    assert not accepted(value)
    assert not parses_as_ulid(value) or len(value) != 26


def test_a_missing_plan_id_is_its_own_reason():
    with pytest.raises(InvalidArgument) as missing:
        validation.plan_id("")
    assert missing.value.reason is Reason.MISSING_FIELD
