"""The ListCheckpoints filter (a small AIP-160 subset) and page tokens (AIP-158).

Grammar: ``term (AND term)*`` where ``term`` is ``FIELD = "VALUE"``; FIELD is phase,
trigger, source_tool or labels.KEY.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field

from checkpointd.core.errors import CheckpointdError, InvalidArgument, Reason
from checkpointd.core.vocabulary import parse_phase, parse_trigger

MAX_FILTER = 2048
MAX_TERMS = 16
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000

_TERM = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_./-]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*')
_AND = re.compile(r"\s*AND\s*")


@dataclass(frozen=True)
class Filter:
    phase: str | None = None
    trigger: str | None = None
    source_tool: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def _bad(text: str, why: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_FILTER, f"invalid filter: {why}", filter=text[:200])


def parse_filter(text: str) -> Filter:
    if not text.strip():
        return Filter()
    if len(text) > MAX_FILTER:
        raise _bad(text, f"longer than {MAX_FILTER} characters")
    values: dict[str, str] = {}
    labels: dict[str, str] = {}
    pos = 0
    for count in range(MAX_TERMS + 1):
        if count == MAX_TERMS:
            raise _bad(text, f"more than {MAX_TERMS} terms")
        match = _TERM.match(text, pos)
        if not match:
            raise _bad(text, f'expected FIELD = "VALUE" at offset {pos}')
        name, raw = match.group(1), re.sub(r"\\(.)", r"\1", match.group(2))
        if name.startswith("labels."):
            labels[name.removeprefix("labels.")] = raw
        elif name in ("phase", "trigger", "source_tool"):
            if name in values:
                raise _bad(text, f"{name} given twice")
            values[name] = raw
        else:
            raise _bad(text, f"unknown field {name!r}; use phase, trigger, source_tool or labels.KEY")
        pos = match.end()
        if pos == len(text):
            break
        joiner = _AND.match(text, pos)
        if not joiner:
            raise _bad(text, f"expected AND at offset {pos}")
        pos = joiner.end()
    try:
        if "phase" in values:
            parse_phase(values["phase"])
        if "trigger" in values:
            parse_trigger(values["trigger"])
    except CheckpointdError as exc:
        raise _bad(text, exc.message) from None
    return Filter(values.get("phase"), values.get("trigger"), values.get("source_tool"), labels)


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument(Reason.INVALID_PAGE_SIZE, "page_size must not be negative", page_size=requested)
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _query_key(plan: str, filter_text: str) -> str:
    return hashlib.sha256(f"{plan}\0{filter_text}".encode()).hexdigest()[:16]


def encode_page_token(plan: str, filter_text: str, before_sequence: int) -> str:
    body = json.dumps({"q": _query_key(plan, filter_text), "s": before_sequence}).encode()
    return base64.urlsafe_b64encode(body).decode().rstrip("=")


def decode_page_token(token: str, plan: str, filter_text: str) -> int | None:
    """The sequence to continue below, or None for the first page."""
    if not token:
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        sequence = body["s"]
        valid = body["q"] == _query_key(plan, filter_text) and isinstance(sequence, int) and sequence > 0
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise InvalidArgument(Reason.INVALID_PAGE_TOKEN,
                              "page_token is malformed or was issued for another plan_id or filter")
    return sequence
