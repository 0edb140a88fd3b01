"""Plan ids: checkpointd names every plan by a ULID (26 Crockford base32 characters), which the
caller chooses. Made here without a ULID library, so the client needs nothing beyond gRPC."""

from __future__ import annotations

import secrets
import time

_CROCKFORD_BASE32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TIMESTAMP_BITS = 48
_RANDOM_BITS = 80


def new_plan_id() -> str:
    """A fresh ULID for a new plan: the current time in milliseconds, then 80 random bits, so ids
    sort by creation time and never collide in practice (`checkpointd new-plan-id` prints one)."""
    milliseconds = time.time_ns() // 1_000_000 & ((1 << _TIMESTAMP_BITS) - 1)
    value = milliseconds << _RANDOM_BITS | secrets.randbits(_RANDOM_BITS)
    # 26 characters of 5 bits hold 130 bits: the first one carries the top 3, so it is 0-7.
    return "".join(_CROCKFORD_BASE32[(value >> shift) & 31] for shift in range(125, -1, -5))
