"""A server process that ends without closing its reader processes (an exception on the way
out, say) still ends: the threads that take the readers' answers must not hold it open (the
readers themselves exit once their task socket closes with it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[3] / "service"


def test_a_process_ending_with_its_readers_running_ends() -> None:
    script = textwrap.dedent("""
        from checkpointd.core.capture.readers import Readers
        readers = Readers(1, None)
        assert readers.start() and readers.pids()
        print("started")
    """)
    # The timeout only bounds a hang: the process ends at once when nothing holds it.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": str(SERVICE), "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout) == (0, "started\n"), done.stderr
