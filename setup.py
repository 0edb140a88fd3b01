"""checkpointd's build: setuptools, with the one dependency that depends on where the build runs.

The server needs checkpointd-client (the client library and the generated checkpoint.v1 code) at
its own version. Built from a source checkout (`pip install .`, `pip install git+URL`, `make
install`), it names the checkout's clients/python by path, so one command installs both although
checkpointd-client is on no index. An sdist, and a wheel built from an sdist (`python -m build` and
`make dist` do that: the artifacts one publishes), ask for `checkpointd-client==VERSION` instead,
as a path would point at nothing on another machine. (PEP 508 has no relative path, and
pip no workspace sources, hence this choice at build time.) So a wheel built straight from a
checkout (`pip wheel .`, `python -m build --wheel`) is for this machine only, unless the build runs
with CHECKPOINTD_CLIENT_DEPENDENCY=version; `make install` sets it too, as pip refuses a path
dependency on the very folder it installs editable in the same command.
"""

import os
import pathlib
import sys

from setuptools import setup

ROOT = pathlib.Path(__file__).resolve().parent
CLIENT = ROOT / "clients" / "python"

SERVER_DEPENDENCIES = [
    "grpcio>=1.75.1",
    "grpcio-health-checking>=1.75.1",
    "grpcio-reflection>=1.75.1",
    "grpcio-status>=1.75.1",
    "googleapis-common-protos>=1.70.0",
    "protobuf>=6.31.1",
    "sqlmodel>=0.0.22",
    "python-ulid>=3.0",
    "alembic>=1.13",
    "inotify_simple>=1.3",
    "prometheus_client>=0.20",
    "rich>=13",
    "psycopg[binary]>=3.2",
    "zstandard>=0.22",
    "uvloop>=0.19",
]


def client_requirement() -> str:
    """`checkpointd-client @ file:///.../clients/python` from a checkout, else `checkpointd-client==VERSION`."""
    override = os.environ.get("CHECKPOINTD_CLIENT_DEPENDENCY", "")
    if override not in ("", "version"):
        raise SystemExit(f"CHECKPOINTD_CLIENT_DEPENDENCY may only be 'version', not {override!r}")
    from_checkout = (CLIENT / "pyproject.toml").is_file() and not (ROOT / "PKG-INFO").exists()
    building_sdist = "sdist" in sys.argv[1:]  # the setuptools command; an sdist's PKG-INFO names no local path
    if from_checkout and not building_sdist and not override:
        return f"checkpointd-client @ {CLIENT.as_uri()}"
    return f"checkpointd-client=={(ROOT / 'VERSION').read_text().strip()}"


setup(install_requires=[client_requirement(), *SERVER_DEPENDENCIES])
