"""The ListCheckpoints filter (a small AIP-160 subset) and page tokens (AIP-158).

Grammar: ``term (AND term)*`` where ``term`` is ``FIELD = "VALUE"``; FIELD is phase,
trigger, source_tool or labels.KEY. Every term must hold (one label named twice with two
values matches nothing); phase, trigger and source_tool may each be given once.

A page token is opaque to clients and authenticated by the server: ``base64url(version |
sequence | HMAC-SHA256(key, plan, filter, sequence))``, with a key shared by the replicas of
one database (``server_secrets``). A token the server did not issue for this plan and this
filter, or one altered in any way, is INVALID_ARGUMENT / INVALID_PAGE_TOKEN.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from checkpointd.core.kernel.errors import CheckpointdError, InvalidArgument, Reason
from checkpointd.core.kernel.vocabulary import parse_phase, parse_trigger

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
    #: (key, value) pairs, each of which a checkpoint's labels must carry.
    labels: tuple[tuple[str, str], ...] = ()


def _bad(text: str, why: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_FILTER, f"invalid filter: {why}", filter=text[:200])


def parse_filter(text: str) -> Filter:
    if not text.strip():
        return Filter()
    if len(text) > MAX_FILTER:
        raise _bad(text, f"longer than {MAX_FILTER} characters")
    if "\0" in text:
        raise _bad(text, "it contains a NUL character")
    values: dict[str, str] = {}
    labels: list[tuple[str, str]] = []
    pos = 0
    for count in range(MAX_TERMS + 1):
        if count == MAX_TERMS:
            raise _bad(text, f"more than {MAX_TERMS} terms")
        match = _TERM.match(text, pos)
        if not match:
            raise _bad(text, f'expected FIELD = "VALUE" at offset {pos}')
        name, raw = match.group(1), re.sub(r"\\(.)", r"\1", match.group(2))
        if name.startswith("labels.") and len(name) > len("labels."):
            labels.append((name.removeprefix("labels."), raw))
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
    return Filter(values.get("phase"), values.get("trigger"), values.get("source_tool"), tuple(labels))


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument(Reason.INVALID_PAGE_SIZE, "page_size must not be negative", page_size=requested)
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


_TOKEN_VERSION = 1
_TOKEN_BODY = struct.Struct(">BQ")
_MAC_BYTES = hashlib.sha256().digest_size
#: What a token the server issued looks like: base64url without padding, of a fixed length.
_TOKEN = re.compile(rf"[A-Za-z0-9_-]{{{-(-(_TOKEN_BODY.size + _MAC_BYTES) * 4 // 3)}}}")


_KEY_TOKEN_VERSION = 2
#: A path key with the count of the items left before it (see ``issue_after_path``).
_COUNTED_KEY_TOKEN_VERSION = 3


class PageTokens:
    """Issues and checks page tokens (see module docstring). ``key`` is called once, when
    the first token is issued or checked."""

    def __init__(self, key: Callable[[], bytes]) -> None:
        self._load_key = key
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def _mac(self, plan: str, filter_text: str, body: bytes) -> bytes:
        if self._key is None:
            with self._lock:
                if self._key is None:
                    self._key = self._load_key()
        message = bytearray(b"checkpointd page token\0")
        for part in (plan.encode(), filter_text.encode("utf-8", "surrogatepass"), body):
            message += struct.pack(">I", len(part)) + part
        return hmac.new(self._key, bytes(message), hashlib.sha256).digest()

    def issue(self, plan: str, filter_text: str, before_sequence: int) -> str:
        body = _TOKEN_BODY.pack(_TOKEN_VERSION, before_sequence)
        return base64.urlsafe_b64encode(body + self._mac(plan, filter_text, body)).decode().rstrip("=")

    def check(self, token: str, plan: str, filter_text: str) -> int | None:
        """The sequence to continue below, or None for the first page (no token)."""
        if not token:
            return None
        if _TOKEN.fullmatch(token):
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            body, mac = raw[:_TOKEN_BODY.size], raw[_TOKEN_BODY.size:]
            version, sequence = _TOKEN_BODY.unpack(body)
            if version == _TOKEN_VERSION and sequence > 0 and hmac.compare_digest(
                    mac, self._mac(plan, filter_text, body)):
                return sequence
        raise InvalidArgument(Reason.INVALID_PAGE_TOKEN,
                              "page_token was not issued by this service for this plan_id and filter")

    def issue_after(self, scope: str, filter_text: str, key: str, version: int = _KEY_TOKEN_VERSION) -> str:
        """A token to continue after ``key`` (an ASCII string such as a plan id), for lists
        that page by a string key rather than by a checkpoint sequence."""
        body = bytes([version]) + key.encode("ascii")
        return base64.urlsafe_b64encode(body + self._mac(scope, filter_text, body)).decode().rstrip("=")

    def check_after(self, token: str, scope: str, filter_text: str, longest_key: int = 128) -> str | None:
        """The key to continue after, or None for the first page (no token). A token whose key
        could be longer than ``longest_key`` characters is refused unread."""
        checked = self._check_key(token, scope, filter_text, longest_key, (_KEY_TOKEN_VERSION,))
        return None if checked is None else checked[1]

    def _check_key(self, token: str, scope: str, filter_text: str, longest_key: int,
                   versions: tuple[int, ...]) -> tuple[int, str] | None:
        """A key token's version (one of ``versions``) and key, or None for no token."""
        if not token:
            return None
        if len(token) <= _max_key_token(longest_key) and re.fullmatch(r"[A-Za-z0-9_-]+", token):
            try:
                raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            except ValueError:
                raw = b""
            body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
            if len(body) > 1 and body[0] in versions and hmac.compare_digest(mac, self._mac(scope, filter_text, body)):
                return body[0], body[1:].decode("ascii")
        raise InvalidArgument(Reason.INVALID_PAGE_TOKEN,
                              "page_token was not issued by this service for this request's filter")

    def issue_after_path(self, scope: str, filter_text: str, path: str, remaining: int | None = None) -> str:
        """A token to continue after workspace path ``path`` (any name, not UTF-8 included).
        ``remaining``, for a list that cannot change between its pages, is how many items the
        later pages hold: the next page need not count them again."""
        key = base64.urlsafe_b64encode(path.encode("utf-8", "surrogateescape")).decode("ascii")
        if remaining is None:
            return self.issue_after(scope, filter_text, key)
        # A version of its own, which a release that knows only path keys refuses (a replica
        # not yet upgraded would otherwise read the count as part of the path).
        return self.issue_after(scope, filter_text, f"{remaining}{_REMAINING_ENDS}{key}", _COUNTED_KEY_TOKEN_VERSION)

    def check_after_path(self, token: str, scope: str, filter_text: str) -> PathResume | None:
        """Where ``issue_after_path``'s ``token`` resumes, or None for the first page."""
        checked = self._check_key(token, scope, filter_text, LONGEST_PATH_KEY + _LONGEST_REMAINING,
                                  (_KEY_TOKEN_VERSION, _COUNTED_KEY_TOKEN_VERSION))
        if checked is None:
            return None
        version, key = checked
        remaining = None
        if version == _COUNTED_KEY_TOKEN_VERSION:
            count, _, key = key.partition(_REMAINING_ENDS)
            if not (count.isascii() and count.isdigit()):
                raise InvalidArgument(Reason.INVALID_PAGE_TOKEN, "page_token is malformed")
            remaining = int(count)
        return PathResume(base64.urlsafe_b64decode(key).decode("utf-8", "surrogateescape"), remaining)


class PathResume(NamedTuple):
    """Where a path-keyed page resumes: after ``path``; ``remaining``, when the token carries
    it, is how many items the pages from there hold."""

    path: str
    remaining: int | None


#: Longest page-token key that names a path (its bytes in base64) accepted: paths of up to 96 KiB.
LONGEST_PATH_KEY = 128 * 1024
#: What ends a path-keyed token's count of the items left (see ``issue_after_path``), and the
#: longest such count with it.
_REMAINING_ENDS = "."
_LONGEST_REMAINING = 21


def _max_key_token(longest_key: int) -> int:
    """Longest key token accepted: a key of ``longest_key`` characters, its version byte and MAC,
    in base64."""
    return (1 + longest_key + _MAC_BYTES) * 4 // 3 + 4
