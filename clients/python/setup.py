"""checkpointd-client's build: generate the checkpoint.v1 modules, then a plain setuptools build.

The generated code is never committed. Before setuptools looks for packages (for a wheel, an
sdist and an editable install alike), protos/generate.py, the one code generator, writes it next to
the .proto files; `protos` is a link to the repository's protos/ here and a real folder in the sdist.
Then the floors of grpcio and protobuf in pyproject.toml are checked against what that code demands
when imported, so a wheel can never promise to work with a runtime its own modules refuse.
"""

import pathlib
import re
import sys
import tomllib

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "protos"))
import generate  # noqa: E402  (protos/ is put on the path just above)


def declared_floors() -> dict[str, tuple[int, ...]]:
    """`NAME>=X.Y.Z` lower bounds of this project's dependencies, by distribution name."""
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*(\d+(?:\.\d+)*)", requirement.strip())
        if match:
            floors[match[1].lower()] = tuple(map(int, match[2].split(".")))
    return floors


def check_floors() -> None:
    declared = declared_floors()
    for distribution, needed in generate.runtime_floors().items():
        have = declared.get(distribution)
        if have is None or have < needed:
            shown = ".".join(map(str, needed))
            raise SystemExit(f"checkpointd-client: the generated code needs {distribution}>={shown} but "
                             f"pyproject.toml declares {distribution}>={'.'.join(map(str, have or ()))}; "
                             "raise the floor or pin the grpcio-tools that generated it")


if generate.main() != 0:
    raise SystemExit("checkpointd-client: protoc failed on protos/ (see above)")
check_floors()
setup()
