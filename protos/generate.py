"""The one command that turns protos/ into Python code (run by `make proto` and by the build of
checkpointd-client, clients/python/setup.py).

Generated modules land next to their .proto files and are never committed or edited. protoc writes
into a scratch folder first; a module that changed then replaces the old one atomically, so a
process importing checkpoint.v1 while a build regenerates never reads half a file, and an unchanged
module keeps its file (and its mtime).
"""

import os
import pathlib
import re
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc

PROTOS = pathlib.Path(__file__).resolve().parent


def main() -> int:
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="checkpointd-generate-") as scratch:
        args = [
            "protoc",
            f"-I{PROTOS}",
            f"-I{well_known}",
            f"--python_out={scratch}",
            f"--pyi_out={scratch}",
            f"--grpc_python_out={scratch}",
            *sources,
        ]
        code = protoc.main(args)
        if code != 0:
            return code
        for generated in sorted(pathlib.Path(scratch).rglob("*.py*")):
            _replace_if_changed(PROTOS / generated.relative_to(scratch), generated.read_bytes())
    for package in {PROTOS / pathlib.Path(s).parent for s in sources}:
        while package != PROTOS:
            (package / "__init__.py").touch()
            package = package.parent
    return 0


def _replace_if_changed(target: pathlib.Path, content: bytes) -> None:
    if target.exists() and target.read_bytes() == content:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        os.unlink(temp)
        raise


_PROTOBUF_GENCODE = re.compile(r"^# Protobuf Python Version: (\d+(?:\.\d+)*)$", re.M)
_GRPC_GENCODE = re.compile(r"^GRPC_GENERATED_VERSION = '(\d+(?:\.\d+)*)'$", re.M)


def runtime_floors() -> dict[str, tuple[int, ...]]:
    """The least protobuf and grpcio the generated modules accept: each one checks it when imported."""
    floors: dict[str, tuple[int, ...]] = {}
    for distribution, pattern, glob in (("protobuf", _PROTOBUF_GENCODE, "*_pb2.py"),
                                        ("grpcio", _GRPC_GENCODE, "*_pb2_grpc.py")):
        for module in PROTOS.rglob(glob):
            for version in pattern.findall(module.read_text()):
                floors[distribution] = max(floors.get(distribution, ()), tuple(map(int, version.split("."))))
    return floors


if __name__ == "__main__":
    sys.exit(main())
