"""Which upstream tools write: what the tools' annotations say, overridden by the command line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def annotated_read_only(tool: Mapping[str, Any]) -> bool:
    """True only for a tool whose annotations say `readOnlyHint: true`; anything else may write.

    The MCP counterpart of `declares_read_only`: a missing, false or malformed hint is a write tool.
    """
    annotations = tool.get("annotations")
    return isinstance(annotations, Mapping) and annotations.get("readOnlyHint") is True


class ToolKinds:
    """Read-only or write, per upstream tool name, learnt from every tools/list the proxy sees.

    Annotations are hints, so `--read-only-tool` / `--write-tool` win over them. A tool the proxy
    has never seen listed is a write tool (`is_read_only` answers False for it).
    """

    def __init__(self, *, read_only: Iterable[str] = (), write: Iterable[str] = ()) -> None:
        self._forced_read_only = frozenset(read_only)
        self._forced_write = frozenset(write)
        self._annotated: dict[str, bool] = {}

    def learn(self, tools: Iterable[Mapping[str, Any]]) -> None:
        for tool in tools:
            name = tool.get("name")
            if isinstance(name, str):
                self._annotated[name] = annotated_read_only(tool)

    def replace_all(self, tools: Iterable[Mapping[str, Any]]) -> None:
        """The upstream's whole tool list, read again after it said the list changed."""
        self._annotated.clear()
        self.learn(tools)

    def knows(self, name: str) -> bool:
        return name in self._annotated or name in self._forced_read_only or name in self._forced_write

    def is_read_only(self, name: str) -> bool:
        if name in self._forced_write:
            return False
        if name in self._forced_read_only:
            return True
        return self._annotated.get(name, False)
