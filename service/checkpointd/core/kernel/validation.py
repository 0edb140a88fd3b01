"""Field rules shared by every entry point. Limits are documented in the .proto."""

from __future__ import annotations

import re

from checkpointd.core.kernel.errors import InvalidArgument, Reason

MAX_SOURCE_TOOL = 256
MAX_DESCRIPTION = 4096
MAX_LABELS = 64
MAX_LABEL_VALUE = 256
MAX_STATE_BYTES = 16 * 1024 * 1024
MAX_PATHS = 1000
MAX_REQUEST_ID = 128
#: Longest etag accepted (the server's are 24 characters).
MAX_ETAG = 128

_LABEL_KEY = re.compile(r"[a-z][a-z0-9_./-]{0,62}")
_REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}")
#: A ULID as python-ulid parses one: 26 Crockford base32 letters (either case), the first at most
#: 7 so that the value fits in 128 bits. Matched, not decoded: every call validates one or two.
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}")


ULID_LENGTH = 26
CROCKFORD_BASE32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD_LETTERS = frozenset(CROCKFORD_BASE32 + CROCKFORD_BASE32.lower())
#: Where a refused plan_id's message sends the caller for a good one.
PLAN_ID_HINT = "make one with `checkpointd new-plan-id`, new_plan_id() (Python) or newPlanId() (Node)"


def ulid_problem(value: str) -> str:
    """What is wrong with a value that is not a ULID, said so that the caller can fix it
    (only called once the pattern has refused it, so one of the three is always true)."""
    if len(value) != ULID_LENGTH:
        return f"is {len(value)} character{'' if len(value) == 1 else 's'} long; a ULID has {ULID_LENGTH}"
    outside = sorted({c for c in value if c not in _CROCKFORD_LETTERS})
    if outside:
        named = ", ".join(repr(c) for c in outside[:8]) + (", ..." if len(outside) > 8 else "")
        return (f"has characters outside Crockford base32: {named} (a ULID uses the digits and the letters "
                "A-Z except I, L, O and U)")
    return f"starts with {value[0]!r}, so it overflows 128 bits: a ULID's first character is 0-7"


def ulid(value: str, field: str, reason: Reason, required: bool = True, hint: str = "") -> str:
    if not value:
        if required:
            raise InvalidArgument(Reason.MISSING_FIELD, f"{field} is required", field=field)
        return value
    if not _ULID.fullmatch(value):
        message = f"{field} {value[:64]!r} is not a ULID: it {ulid_problem(value)}"
        raise InvalidArgument(reason, f"{message}; {hint}" if hint else message, field=field, value=value[:64])
    return value.upper()


def plan_id(value: str, required: bool = True) -> str:
    return ulid(value, "plan_id", Reason.INVALID_PLAN_ID, required, hint=PLAN_ID_HINT)


def checkpoint_id(value: str, field: str = "checkpoint_id", required: bool = True) -> str:
    return ulid(value, field, Reason.INVALID_CHECKPOINT_ID, required)


def max_length(value: str | bytes, limit: int, field: str) -> None:
    if len(value) > limit:
        raise InvalidArgument(Reason.FIELD_TOO_LONG, f"{field} is longer than {limit}", field=field, limit=limit)


def text(value: str, limit: int, field: str) -> None:
    """A text field: at most ``limit`` characters and no NUL, which PostgreSQL cannot store
    (refused on SQLite too, so a request means the same on every database)."""
    max_length(value, limit, field)
    if "\0" in value:
        raise InvalidArgument(Reason.INVALID_CHARACTER, f"{field} contains a NUL character", field=field)


def labels(values: dict[str, str]) -> dict[str, str]:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(Reason.INVALID_LABEL, f"at most {MAX_LABELS} labels", key="", limit=MAX_LABELS)
    for key, value in values.items():
        if not _LABEL_KEY.fullmatch(key):
            raise InvalidArgument(Reason.INVALID_LABEL,
                                  f"label key {key[:80]!r} must match [a-z][a-z0-9_./-]{{0,62}}", key=key[:80])
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(Reason.INVALID_LABEL, f"label {key!r} is longer than {MAX_LABEL_VALUE}",
                                  key=key)
        if "\0" in value:
            raise InvalidArgument(Reason.INVALID_CHARACTER, f"label {key!r} contains a NUL character",
                                  field=f"labels.{key}")
    return dict(values)


def is_valid_request_id(value: str) -> bool:
    return bool(_REQUEST_ID.fullmatch(value))


def request_id(value: str) -> str:
    if value and not is_valid_request_id(value):
        raise InvalidArgument(Reason.INVALID_REQUEST_ID,
                              f"request_id must be 1-{MAX_REQUEST_ID} printable ASCII characters",
                              field="request_id")
    return value
