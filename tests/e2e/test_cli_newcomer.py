"""What a newcomer met in the `checkpointd` command line, run as a user runs it (a subprocess,
against real servers): slow starts, refusals that gave another command's advice, help that was not
true, questions asked before the answer could matter, counts in bad English, options accepted and
ignored, and typos met with a bare "invalid choice"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ulid import ULID

from tests.conftest import CHECKPOINTD, free_port
from tests.ops.conftest import run_cli

FAR_AWAY = "01ARZ3NDEKTSV4RRFFQ69G5FZZ"  # a valid ULID no server knows
#: Server-side packages: a command that does not open a database has no use for them (~1 s to load).
DATABASE_PACKAGES = {"sqlmodel", "sqlalchemy", "alembic", "zstandard"}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKPOINTD_")}
    return {**env, "COLUMNS": "250", **extra}


def _run(*args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHECKPOINTD, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=_clean_env())


def _no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr, done.stderr


# -- 1. start-up: a command loads what it uses -------------------------------------------------

_LOADED = """
import sys
from checkpointd.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
print("LOADED", sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1].split(","))))
"""
#: Stands for the address of a port nobody listens on.
DOWN = "DOWN"


@pytest.mark.parametrize("args", [["--help"], ["new-plan-id"], ["ls", "--help"], ["gc", "--help"],
                                  ["ls", FAR_AWAY, "--target", DOWN], ["diff", FAR_AWAY, "--target", DOWN]],
                         ids=" ".join)
def test_commands_that_open_no_database_do_not_load_the_database_code(args):
    """`--help`, `new-plan-id` and the client commands took 1.5-2.2 s to start, 1.1 s of it loading
    SQLModel, SQLAlchemy and alembic, which only serve, gc, stats and fsck use."""
    args = [f"127.0.0.1:{free_port()}" if a == DOWN else a for a in args]
    done = subprocess.run([sys.executable, "-c", _LOADED, ",".join(sorted(DATABASE_PACKAGES)), *args],
                          capture_output=True, text=True, timeout=120, env=_clean_env())
    loaded = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED []"], (done.stdout[-2000:], done.stderr[-2000:])


def test_the_clis_store_choices_are_the_servers_store_kinds():
    """The parser names the store kinds without importing the store (SQLAlchemy) to ask it."""
    from checkpointd.commands import STORE_CHOICES
    from checkpointd.core.store.db_store import StoreKind

    assert sorted(STORE_CHOICES) == sorted(kind.value for kind in StoreKind)


# -- 2. a refusal beside a running server names the command refused ---------------------------


def test_offline_commands_refused_beside_a_server_say_what_to_do_for_themselves(fresh_server):
    data = ["--data-dir", str(fresh_server.data_dir)] + (["--db-url", fresh_server.db_url]
                                                          if fresh_server.db_url else [])
    stats = _run("stats", *data)
    assert stats.returncode == 1, stats.stderr
    assert "`checkpointd stats`" in stats.stderr and "`checkpointd plans`" in stats.stderr, stats.stderr
    assert "garbage collection" not in stats.stderr and "--gc-interval" not in stats.stderr, stats.stderr
    gc = _run("gc", *data)
    assert gc.returncode == 1, gc.stderr
    assert "`checkpointd gc`" in gc.stderr and "--gc-interval" in gc.stderr, gc.stderr
    fsck = _run("fsck", *data)
    assert fsck.returncode == 2, fsck.stderr
    assert "--target" in fsck.stderr, fsck.stderr
    for done in (stats, gc, fsck):
        _no_traceback(done)
    assert fresh_server.serving()


# -- 3. a checkpoint without a workspace ------------------------------------------------------


def test_create_help_says_what_a_checkpoint_without_a_workspace_holds():
    done = _run("create", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "needed on its first checkpoint" not in text
    assert "plan state only" in text, text


def test_a_diff_of_checkpoints_made_without_a_workspace_says_why_and_what_to_do(checkpointd_server, tcp):
    plan = str(ULID())
    made = [run_cli("create", plan, "--json", *tcp) for _ in range(2)]
    assert [m.returncode for m in made] == [0, 0], [m.stderr for m in made]
    first, second = (json.loads(m.stdout)["checkpoint_id"] for m in made)
    done = run_cli("diff", first, second, *tcp)
    assert done.returncode == 1, done.stdout
    assert "NO_WORKSPACE" in done.stderr and "without --workspace-root" in done.stderr, done.stderr
    # What the hint says to do works: the plan records files from then on.
    workspace = checkpointd_server.new_workspace()
    (workspace / "a.txt").write_text("one")
    with_files = run_cli("create", plan, "--workspace-root", str(workspace), "--json", *tcp)
    assert with_files.returncode == 0, with_files.stderr
    (workspace / "a.txt").write_text("two")
    since = run_cli("diff", json.loads(with_files.stdout)["checkpoint_id"], *tcp)
    assert since.returncode == 0 and "1 modified" in since.stdout, since.stderr


# -- 4. the offline commands document their options alike ------------------------------------


def _option_help(command: str, option: str) -> str:
    done = _run(command, "--help")
    assert done.returncode == 0, done.stderr
    lines = [" ".join(line.split()) for line in done.stdout.splitlines() if line.lstrip().startswith(option + " ")]
    assert len(lines) == 1, done.stdout
    return lines[0]


@pytest.mark.parametrize("option", ["--data-dir", "--db-url", "--store"])
def test_gc_stats_and_fsck_document_their_data_dir_options_alike(option):
    helps = {command: _option_help(command, option) for command in ("gc", "stats", "fsck")}
    assert len(set(helps.values())) == 1, helps
    assert "Env CHECKPOINTD_" in helps["gc"], helps["gc"]


# -- 5, 6. questions asked only when the answer matters, and a way past them -------------------


def test_delete_of_an_unknown_checkpoint_fails_before_asking(tcp):
    done = run_cli("delete", FAR_AWAY, *tcp, stdin="y\n")
    assert done.returncode == 1
    assert "Delete checkpoint" not in done.stderr, done.stderr
    assert "NOT_FOUND" in done.stderr, done.stderr


def test_delete_asks_and_deletes_when_answered_yes(checkpoint, tcp):
    done = run_cli("delete", checkpoint["checkpoint_id"], *tcp, stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert "Delete checkpoint" in done.stderr
    assert run_cli("show", checkpoint["checkpoint_id"], *tcp).returncode == 1


@pytest.mark.parametrize("command", ["rollback", "delete"])
def test_a_confirmation_nobody_can_answer_says_to_pass_yes(command, checkpoint, tcp):
    (checkpoint["_workspace"] / "a.txt").write_text("changed")
    args = ([checkpoint["plan_id"]] if command == "rollback" else []) + [checkpoint["checkpoint_id"]]
    done = run_cli(command, *args, *tcp)  # stdin: a pipe at its end, no terminal
    assert done.returncode == 1, done.stdout
    assert "--yes" in done.stderr, done.stderr
    assert (checkpoint["_workspace"] / "a.txt").read_text() == "changed"
    assert run_cli("show", checkpoint["checkpoint_id"], *tcp).returncode == 0


# -- 7. counts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "expected"), [(0, "0 paths"), (1, "1 path"), (2, "2 paths")])
def test_counted_says_one_thing_or_several(count, expected):
    from checkpointd.commands.render import counted

    assert counted(count, "path") == expected


def test_ls_of_one_checkpoint_says_one_checkpoint(checkpoint, tcp):
    done = run_cli("ls", checkpoint["plan_id"], *tcp)
    assert done.returncode == 0, done.stderr
    assert "1 checkpoint" in done.stdout and "(s)" not in done.stdout, done.stdout


# -- 8. no option accepted only to be ignored --------------------------------------------------


def test_cat_refuses_json_it_cannot_print(checkpoint, tcp):
    done = run_cli("cat", checkpoint["checkpoint_id"], "a.txt", "--json", *tcp)
    assert done.returncode == 2, done.stdout
    assert "--json" in done.stderr and done.stdout == ""


# -- 9. typos and a bare `checkpointd` -----------------------------------------------------------


@pytest.mark.parametrize(("args", "meant"), [(["lss"], "ls"), (["rolback"], "rollback"),
                                             (["config", "lst"], "ls"), (["gc", "--store", "dsk"], "disk")])
def test_a_mistyped_choice_suggests_the_close_one(args, meant):
    done = _run(*args)
    assert done.returncode == 2
    _no_traceback(done)
    assert f"did you mean {meant!r}?" in done.stderr, done.stderr


@pytest.mark.parametrize("command", ["serve", "gc", "stats", "fsck"])
def test_a_store_mistyped_in_the_environment_is_a_usage_error_not_a_traceback(command):
    """argparse checks choices against the command line only: CHECKPOINTD_STORE=Disk reached
    StoreKind('Disk') as a traceback (helper-66)."""
    done = run_cli(command, "--data-dir", os.devnull + "-not-used", env={"CHECKPOINTD_STORE": "Disk"})
    assert done.returncode == 2
    _no_traceback(done)
    assert "'Disk' (from --store or CHECKPOINTD_STORE) is not a store: did you mean 'disk'?" in done.stderr


def test_a_bare_checkpointd_shows_usage_and_points_at_help():
    done = _run()
    assert done.returncode == 2
    assert done.stderr.startswith("usage: checkpointd"), done.stderr
    assert "`checkpointd --help`" in done.stderr, done.stderr


#: `checkpointd ls PLAN` in this interpreter, getting SIGINT while the command's own modules load.
_INTERRUPTED_WHILE_THE_COMMAND_LOADS = """
import importlib, os, signal, sys
from checkpointd import cli

real = importlib.import_module

def import_module(name, *args, **kwargs):
    if name == "checkpointd.commands.checkpoints":
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # a handler runs at one of these backward jumps, in here
            pass
    return real(name, *args, **kwargs)

importlib.import_module = import_module
sys.exit(cli.main(["ls", sys.argv[1]]))
"""


def test_ctrl_c_while_a_commands_modules_load_is_answered_as_loading():
    """The command's modules (the client, rich) load while a Ctrl-C is only noted, as serve's do:
    a KeyboardInterrupt raised inside an import can land in a finalizer, printed as a traceback."""
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_WHILE_THE_COMMAND_LOADS, str(ULID())],
                          capture_output=True, text=True, timeout=60, env=_clean_env())
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert "interrupted while loading" in done.stderr, done.stderr
    _no_traceback(done)


def test_export_to_stdout_refuses_json_it_cannot_print(checkpoint, tcp):
    done = run_cli("export", checkpoint["checkpoint_id"], "--output", "-", "--json", *tcp)
    assert done.returncode == 2 and done.stdout == ""
    assert "--json describes an archive written to a file" in done.stderr, done.stderr
