"""new-plan-id: a fresh ULID for a new plan, from the client's own generator."""

from __future__ import annotations

import argparse

from checkpointd_client import new_plan_id as make_plan_id


def new_plan_id(_args: argparse.Namespace) -> int:
    print(make_plan_id())
    return 0
