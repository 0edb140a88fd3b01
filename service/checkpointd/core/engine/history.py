"""A plan's recorded checkpoints: get one (with its state), list them a page at a time under
a filter, count them, delete one."""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import col, select

from checkpointd.core.engine import filtering
from checkpointd.core.engine.parts import EngineParts, not_found_if_deleted
from checkpointd.core.engine.recovery import Recovery
from checkpointd.core.engine.requests import Checkpoint
from checkpointd.core.kernel import validation
from checkpointd.core.kernel.errors import DataLoss
from checkpointd.core.metadata.models import CheckpointRow
from checkpointd.core.metadata.server_secrets import PAGE_TOKEN_KEY, shared_secret


class History:
    def __init__(self, parts: EngineParts, recovery: Recovery) -> None:
        self.parts = parts
        self.recovery = recovery
        self.page_tokens = filtering.PageTokens(lambda: shared_secret(parts.db, PAGE_TOKEN_KEY))

    def get(self, checkpoint_id: str, with_state: bool = False) -> Checkpoint:
        checkpoint_id = validation.checkpoint_id(checkpoint_id)
        with self.parts.db.session() as session:
            row = self.parts.load(session, checkpoint_id)
        try:
            return Checkpoint(row, self.parts.state(row) if with_state else None)
        except DataLoss:
            not_found_if_deleted(self.parts.db, checkpoint_id)
            raise

    def list(self, plan_id: str, page_size: int = 0, page_token: str = "",
             filter_text: str = "") -> tuple[list[Checkpoint], str]:
        plan_id = validation.plan_id(plan_id)
        size = filtering.page_size(page_size)
        wanted = filtering.parse_filter(filter_text)
        before = self.page_tokens.check(page_token, plan_id, filter_text)
        query = select(CheckpointRow).where(CheckpointRow.plan_id == plan_id)
        if before is not None:
            query = query.where(CheckpointRow.sequence < before)
        if wanted.phase:
            query = query.where(CheckpointRow.phase == wanted.phase)
        if wanted.trigger:
            query = query.where(CheckpointRow.trigger == wanted.trigger)
        if wanted.source_tool is not None:
            query = query.where(CheckpointRow.source_tool == wanted.source_tool)
        for key, value in wanted.labels:
            query = query.where(col(CheckpointRow.labels)[key].as_string() == value)
        query = query.order_by(col(CheckpointRow.sequence).desc()).limit(size + 1)
        with self.parts.db.session() as session:
            rows = list(session.exec(query).all())
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            token = self.page_tokens.issue(plan_id, filter_text, rows[-1].sequence)
        return [Checkpoint(r) for r in rows], token

    def page_token_after(self, plan_id: str, filter_text: str, last: Checkpoint) -> str:
        """The token of a ``list`` page that ends at ``last`` (a caller that answers fewer than
        the page held, to keep its answer small)."""
        return self.page_tokens.issue(validation.plan_id(plan_id), filter_text, last.row.sequence)

    def count(self, plan_id: str) -> int:
        with self.parts.db.session() as session:
            return session.exec(select(func.count()).where(CheckpointRow.plan_id == plan_id)).one()

    def delete(self, checkpoint_id: str) -> None:
        parts = self.parts
        checkpoint_id = validation.checkpoint_id(checkpoint_id)
        with parts.db.session() as session:
            row = parts.load(session, checkpoint_id)
        with self.recovery.deleting(row.plan_id), parts.db.session() as session:
            row = parts.load(session, checkpoint_id)
            session.delete(row)
            session.commit()
