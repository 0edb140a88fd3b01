"""A bearer token's text, read alike by the server (api.auth) and the CLI (commands.connection).

Standard library only: the CLI reads a token without loading the server."""

from __future__ import annotations


class TokenError(ValueError):
    """The configured token is unusable."""


def token_text(raw: bytes | str, origin: str) -> str:
    """The token as the server and the CLI both take it from a file or CHECKPOINTD_TOKEN: UTF-8
    text with surrounding whitespace (a file's trailing newline) stripped. The one place that says so."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TokenError(f"the bearer token from {origin} is not UTF-8 text") from None
    return raw.strip()
