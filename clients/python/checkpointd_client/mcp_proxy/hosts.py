"""The hosts a proxy serves, for the upstream's notifications that belong to no request."""

from __future__ import annotations

import logging

import mcp_types as types
from mcp.server.session import ServerSession

logger = logging.getLogger(__name__)


class HostConnections:
    """One host connection over stdio; one per session when serving Streamable HTTP.

    A connection is known from its `notifications/initialized` on; one that can no longer be
    written to is dropped at the next notification.
    """

    def __init__(self) -> None:
        self._sessions: list[ServerSession] = []

    def add(self, session: ServerSession) -> None:
        self._sessions.append(session)

    def __len__(self) -> int:
        return len(self._sessions)

    async def broadcast(self, notification: types.ServerNotification) -> None:
        for session in list(self._sessions):
            try:
                await session.send_notification(notification)
            except Exception as error:  # a closed connection, whatever the transport calls it
                logger.debug("dropping a host connection that cannot be notified: %r", error)
                self._sessions.remove(session)
