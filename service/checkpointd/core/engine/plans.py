"""Finding plans: ListPlans (AIP-158 paging, a small AIP-160 filter) and GetPlan.

Plans page by plan id, newest first (a ULID made by new-plan-id sorts by creation time), with
page tokens authenticated as ListCheckpoints' are. A plan's last activity is the time of its
newest checkpoint, read through the (plan_id, sequence) index: no column is kept up to date on
the create path for it.

Filter grammar: ``term (AND term)*``, ``term`` is ``FIELD OP "VALUE"``:
``workspace_root = "/abs"`` (exact), ``workspace_root : "/abs"`` (that directory or under it),
``update_time OP "RFC 3339"`` with OP one of < <= > >=, and ``labels.KEY = "VALUE"``: plans
with at least one checkpoint carrying that label (a plan's labels are its checkpoints' labels,
so there is nothing to keep in step; several label terms may be met by different checkpoints).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import func, or_, tuple_
from sqlmodel import col, select

from checkpointd.core.engine import filtering
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import InvalidArgument, NotFound, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import CheckpointRow, PlanRow

#: The scope page tokens of ListPlans are issued for (a plan id is never this).
_TOKEN_SCOPE = "ListPlans"
_TERM = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_./-]*)\s*(<=|>=|=|:|<|>)\s*"((?:[^"\\]|\\.)*)"\s*')
_AND = re.compile(r"\s*AND\s*")
_TIME_OPERATORS = ("<", "<=", ">", ">=")


@dataclass(frozen=True)
class PlanSummary:
    plan_id: str
    workspace_root: str | None
    create_time: datetime
    update_time: datetime
    checkpoint_count: int
    newest_checkpoint_id: str
    total_size_bytes: int


@dataclass(frozen=True)
class PlanFilter:
    #: Each term must hold: two different exact roots match no plan.
    workspace_root: tuple[str, ...] = ()
    under_root: tuple[str, ...] = ()
    #: (operator, UTC time) pairs on the newest checkpoint's time.
    update_time: list[tuple[str, datetime]] = field(default_factory=list)
    #: (key, value) pairs, each carried by at least one of the plan's checkpoints.
    labels: tuple[tuple[str, str], ...] = ()


def _bad(text: str, why: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_FILTER, f"invalid filter: {why}", filter=text[:200])


def _time(text: str, raw: str) -> datetime:
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise _bad(text, f'update_time takes an RFC 3339 time such as "2026-01-31T12:00:00Z", got {raw!r}') from None
    if value.tzinfo is None:
        raise _bad(text, f"update_time {raw!r} needs a time zone (e.g. a trailing Z)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00, before the first representable UTC time
        raise _bad(text, f"update_time {raw!r} is outside the times that can be compared") from None


def parse_plan_filter(text: str) -> PlanFilter:
    if not text.strip():
        return PlanFilter()
    if len(text) > filtering.MAX_FILTER:
        raise _bad(text, f"longer than {filtering.MAX_FILTER} characters")
    if "\0" in text:
        raise _bad(text, "it contains a NUL character")
    exact: list[str] = []
    under: list[str] = []
    times: list[tuple[str, datetime]] = []
    labels: list[tuple[str, str]] = []
    pos = 0
    for count in range(filtering.MAX_TERMS + 1):
        if count == filtering.MAX_TERMS:
            raise _bad(text, f"more than {filtering.MAX_TERMS} terms")
        match = _TERM.match(text, pos)
        if not match:
            raise _bad(text, f'expected FIELD OP "VALUE" at offset {pos}')
        name, operator, raw = match.group(1), match.group(2), re.sub(r"\\(.)", r"\1", match.group(3))
        if name == "workspace_root":
            if operator not in ("=", ":"):
                raise _bad(text, 'workspace_root takes = (exact) or : (that directory or under it)')
            if not raw.startswith("/"):
                raise _bad(text, f"workspace_root {raw!r} must be an absolute path")
            # Spelled as a create may spell it (``//``, ``.``, ``..``, a symlink): the plan's root
            # is recorded as CreateCheckpoint's realpath of it, so the filter's is taken the same way.
            (exact if operator == "=" else under).append(os.path.realpath(raw))
        elif name == "update_time":
            if operator not in _TIME_OPERATORS:
                raise _bad(text, "update_time takes <, <=, > or >=")
            times.append((operator, _time(text, raw)))
        elif name.startswith("labels.") and len(name) > len("labels."):
            if operator != "=":
                raise _bad(text, f'{name} takes = "VALUE"')
            labels.append((name.removeprefix("labels."), raw))
        else:
            raise _bad(text, f"unknown field {name!r}; use workspace_root, update_time or labels.KEY")
        pos = match.end()
        if pos == len(text):
            break
        joiner = _AND.match(text, pos)
        if not joiner:
            raise _bad(text, f"expected AND at offset {pos}")
        pos = joiner.end()
    return PlanFilter(tuple(exact), tuple(under), times, tuple(labels))


class Plans:
    """Reads plans and what their checkpoints add up to; never writes."""

    def __init__(self, db: Database, page_tokens: filtering.PageTokens) -> None:
        self.db = db
        self.page_tokens = page_tokens

    def get(self, plan_id: str) -> PlanSummary:
        plan_id = validation.plan_id(plan_id)
        with self.db.session() as session:
            plan = session.get(PlanRow, plan_id)
            if plan is None:
                raise NotFound(Reason.PLAN_NOT_FOUND, f"plan {plan_id} not found (no checkpoint was ever recorded "
                                                      "for it; `checkpointd plans` lists the plans there are)",
                               plan_id=plan_id)
            return self._summaries(session, [plan])[0]

    def list(self, page_size: int = 0, page_token: str = "", filter_text: str = "") -> tuple[list[PlanSummary], str]:
        size = filtering.page_size(page_size)
        wanted = parse_plan_filter(filter_text)
        after = self.page_tokens.check_after(page_token, _TOKEN_SCOPE, filter_text)
        query = select(PlanRow)
        if after is not None:
            query = query.where(PlanRow.plan_id < after)
        for root in wanted.workspace_root:
            query = query.where(PlanRow.workspace_root == root)
        for root in wanted.under_root:
            prefix = "/" if root == "/" else root + "/"
            query = query.where(or_(PlanRow.workspace_root == root,
                                    func.substr(PlanRow.workspace_root, 1, len(prefix)) == prefix))
        if wanted.update_time:
            newest = (select(CheckpointRow.create_time).where(CheckpointRow.plan_id == PlanRow.plan_id)
                      .order_by(col(CheckpointRow.sequence).desc()).limit(1).correlate(PlanRow).scalar_subquery())
            activity = func.coalesce(newest, PlanRow.create_time)
            for operator, moment in wanted.update_time:
                query = query.where(_compare(activity, operator, moment))
        for key, value in wanted.labels:
            query = query.where(select(CheckpointRow.checkpoint_id)
                                .where(CheckpointRow.plan_id == PlanRow.plan_id,
                                       col(CheckpointRow.labels)[key].as_string() == value)
                                .correlate(PlanRow).exists())
        query = query.order_by(col(PlanRow.plan_id).desc()).limit(size + 1)
        with self.db.session() as session:
            rows = list(session.exec(query).all())
            token = ""
            if len(rows) > size:
                rows = rows[:size]
                token = self.page_tokens.issue_after(_TOKEN_SCOPE, filter_text, rows[-1].plan_id)
            return self._summaries(session, rows), token

    @staticmethod
    def _summaries(session, plans: list[PlanRow]) -> list[PlanSummary]:
        """Counts, sizes and newest checkpoints of ``plans``, in two indexed queries."""
        if not plans:
            return []
        ids = [p.plan_id for p in plans]
        totals = {plan_id: (count, size or 0, newest) for plan_id, count, size, newest in session.exec(
            select(CheckpointRow.plan_id, func.count(), func.sum(CheckpointRow.total_size_bytes
                                                                  + CheckpointRow.state_size_bytes),
                   func.max(CheckpointRow.sequence))
            .where(col(CheckpointRow.plan_id).in_(ids)).group_by(CheckpointRow.plan_id)).all()}
        newest_keys = [(plan_id, newest) for plan_id, (_, _, newest) in totals.items()]
        newest_rows = {}
        if newest_keys:
            newest_rows = {plan_id: (checkpoint_id, created) for plan_id, checkpoint_id, created in session.exec(
                select(CheckpointRow.plan_id, CheckpointRow.checkpoint_id, CheckpointRow.create_time)
                .where(tuple_(CheckpointRow.plan_id, CheckpointRow.sequence).in_(newest_keys))).all()}
        summaries = []
        for plan in plans:
            count, size, _ = totals.get(plan.plan_id, (0, 0, None))
            newest_id, newest_time = newest_rows.get(plan.plan_id, ("", None))
            summaries.append(PlanSummary(plan.plan_id, plan.workspace_root, plan.create_time,
                                         newest_time or plan.create_time, count, newest_id, int(size)))
        return summaries


def _compare(column, operator: str, moment: datetime):
    match operator:
        case "<":
            return column < moment
        case "<=":
            return column <= moment
        case ">":
            return column > moment
        case _:
            return column >= moment
