"""config ls / get / set / clear: ConfigService for people."""

from __future__ import annotations

import argparse
import json
import shlex

from checkpointd.commands import render
from checkpointd.commands.connection import connect
from checkpointd.commands.failures import reports_errors
from checkpointd.commands.interruption import on_interrupt
from checkpointd_client import CheckpointdRpcError


class ConfigUsageError(ValueError):
    """VALUE words that cannot mean a value of this key."""


def parse_value(text: str) -> object:
    """JSON if it parses (5000, true, ["a","b"]); otherwise the text itself as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def value_of(key: str, words: list[str], list_valued: bool) -> object:
    """The value that ``config set KEY WORDS...`` means. One word is JSON or else a string; for a
    key whose value is a list, each of several words is an item and a single plain word is a
    one-item list. Commas are never split: a file pattern may hold one."""
    if len(words) > 1:
        if not list_valued:
            raise ConfigUsageError(f"{key} takes one value, got {len(words)} words; quote it as one argument")
        return list(words)
    value = parse_value(words[0])
    return [value] if list_valued and isinstance(value, str) else value


def list_form(key: str) -> str:
    """How a list is written on the command line, for the key's error message."""
    return (f"{key} takes a list: give each item as its own word (checkpointd config set {key} ITEM [ITEM...]) "
            f"or one JSON list ({shlex.quote(json.dumps(['a', 'b'], separators=(',', ':')))}; [] for none)")


def _show(entries: list, args: argparse.Namespace, title: str) -> int:
    if args.json:
        render.emit_json([render.message_dict(e) for e in entries])
    else:
        render.out.print(render.config_table(entries, title))
    return 0


def _scope(args: argparse.Namespace) -> str:
    return f"plan {args.plan}" if args.plan else "global"


def _changing(args: argparse.Namespace):
    return on_interrupt(f"interrupted after the change was sent: it may have applied "
                        f"(`checkpointd config get {args.key}` shows it)")


@reports_errors
def config_ls(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        entries = conn.config().list_config(plan_id=args.plan)
    return _show(entries, args, f"configuration ({_scope(args)})")


@reports_errors
def config_get(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        entry = conn.config().get_config(args.key, plan_id=args.plan)
    return _show([entry], args, f"configuration ({_scope(args)})")


@reports_errors
def config_set(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        config = conn.config()
        list_valued = config.get_config(args.key, plan_id=args.plan).default_value.HasField("list_value")
        try:
            value = value_of(args.key, args.value, list_valued)
            with _changing(args):
                entry = config.set_config(args.key, value, plan_id=args.plan, etag=args.etag)
        except ConfigUsageError as error:
            render.error(str(error))
            return 2
        except CheckpointdRpcError as error:
            if not (list_valued and error.reason == "INVALID_CONFIG_VALUE" and not isinstance(value, list)):
                raise
            render.error(f"{error}; {list_form(args.key)}")
            return 1
    return _show([entry], args, f"set ({_scope(args)})")


@reports_errors
def config_clear(args: argparse.Namespace) -> int:
    with connect(args) as conn, _changing(args):
        entry = conn.config().clear_config(args.key, plan_id=args.plan, etag=args.etag)
    return _show([entry], args, f"cleared ({_scope(args)}); now in effect")
