"""The one command that turns protos/ into Python code (run by `make proto`).

Generated modules land next to their .proto files and are never committed or edited.
"""

import pathlib
import sys

import grpc_tools
from grpc_tools import protoc

PROTOS = pathlib.Path(__file__).resolve().parent


def main() -> int:
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{well_known}",
        f"--python_out={PROTOS}",
        f"--pyi_out={PROTOS}",
        f"--grpc_python_out={PROTOS}",
        *sources,
    ]
    code = protoc.main(args)
    if code != 0:
        return code
    for package in {PROTOS / pathlib.Path(s).parent for s in sources}:
        while package != PROTOS:
            (package / "__init__.py").touch()
            package = package.parent
    return 0


if __name__ == "__main__":
    sys.exit(main())
