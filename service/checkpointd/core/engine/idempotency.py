"""Request ids (AIP-155): a request's fingerprint, the row that records what a replay of it
returns, and the checks that refuse an id reused for a different request."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from checkpointd.core.engine.records import OPERATIONS
from checkpointd.core.kernel.errors import InvalidArgument, Reason
from checkpointd.core.metadata.db import Database
from checkpointd.core.metadata.models import OperationRow, utcnow
from checkpointd.core.metadata.rows import CoreRows


def fingerprint(**fields: object) -> str:
    canonical = json.dumps(fields, sort_keys=True, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))
    return hashlib.sha256(canonical.encode()).hexdigest()


def operation(request_id: str, method: str, fingerprint: str, result: dict[str, object]) -> dict[str, object]:
    """The row that records a request_id (AIP-155) and what a replay of it returns."""
    return {"request_id": request_id, "method": method, "fingerprint": fingerprint, "result": result,
            "create_time": utcnow()}


def replayed(session: Session, request_id: str, method: str, fingerprint: str) -> OperationRow | None:
    if not request_id:
        return None
    op = session.get(OperationRow, request_id)
    if op is None:
        return None
    if op.method != method or op.fingerprint != fingerprint:
        raise InvalidArgument(Reason.REQUEST_ID_REUSED,
                              f"request_id {request_id!r} was already used for a different request",
                              request_id=request_id)
    return op


def record_operation(session: Session, request_id: str, method: str, fingerprint: str,
                     result: dict[str, object]) -> OperationRow | None:
    """Adds the request_id's record to the transaction; None when it is ours.

    If a concurrent request (another replica's) recorded the same request_id first, this
    transaction is rolled back and the winner's record returned, to be replayed; a winner
    that was a different request is REQUEST_ID_REUSED.
    """
    if not request_id:
        return None
    try:
        CoreRows(session.connection()).insert(OPERATIONS, [operation(request_id, method, fingerprint, result)])
    except IntegrityError:
        session.rollback()
        winner = replayed(session, request_id, method, fingerprint)
        if winner is None:
            raise
        return winner
    return None


def forget_rollback(db: Database, request_id: str) -> None:
    """A rollback that did not happen must not be replayed as done."""
    if not request_id:
        return
    with db.session() as session:
        op = session.get(OperationRow, request_id)
        if op is not None and op.method == "Rollback":
            session.delete(op)
            session.commit()
