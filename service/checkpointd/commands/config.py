"""config ls / get / set / clear: ConfigService for people."""

from __future__ import annotations

import argparse
import json

from checkpointd.commands import render
from checkpointd.commands.checkpoints import reports_errors
from checkpointd.commands.connection import connect


def parse_value(text: str) -> object:
    """JSON if it parses (5000, true, ["a","b"]); otherwise the text itself as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _show(entries: list, args: argparse.Namespace, title: str) -> int:
    if args.json:
        render.emit_json([render.message_dict(e) for e in entries])
    else:
        render.out.print(render.config_table(entries, title))
    return 0


def _scope(args: argparse.Namespace) -> str:
    return f"plan {args.plan}" if args.plan else "global"


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
        entry = conn.config().set_config(args.key, parse_value(args.value), plan_id=args.plan)
    return _show([entry], args, f"set ({_scope(args)})")


@reports_errors
def config_clear(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        entry = conn.config().clear_config(args.key, plan_id=args.plan)
    return _show([entry], args, f"cleared ({_scope(args)}); now in effect")
