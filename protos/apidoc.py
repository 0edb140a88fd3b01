"""Render protos/API.md, the Markdown API reference, from the .proto files (run by `make proto`).

The comments in the .proto files are the documentation; this script only lays them out,
so the reference cannot say something the contract does not. Output is deterministic
(files sorted by name, declarations in source order) so a test can require that the
committed API.md equals a fresh render.

    python protos/apidoc.py            # rewrite protos/API.md
    python protos/apidoc.py --check    # exit 1 if protos/API.md is stale
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import grpc_tools
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

PROTOS = pathlib.Path(__file__).resolve().parent
OUTPUT = PROTOS / "API.md"
WELL_KNOWN = pathlib.Path(grpc_tools.__file__).parent / "_proto"

# Field numbers inside descriptor.proto, used to address SourceCodeInfo locations.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM, MESSAGE_ONEOF = 2, 3, 4, 8
ENUM_VALUE = 2
SERVICE_METHOD = 2

FieldType = descriptor_pb2.FieldDescriptorProto
SCALAR_NAMES = {
    FieldType.TYPE_DOUBLE: "double",
    FieldType.TYPE_FLOAT: "float",
    FieldType.TYPE_INT64: "int64",
    FieldType.TYPE_UINT64: "uint64",
    FieldType.TYPE_INT32: "int32",
    FieldType.TYPE_FIXED64: "fixed64",
    FieldType.TYPE_FIXED32: "fixed32",
    FieldType.TYPE_BOOL: "bool",
    FieldType.TYPE_STRING: "string",
    FieldType.TYPE_BYTES: "bytes",
    FieldType.TYPE_UINT32: "uint32",
    FieldType.TYPE_SFIXED32: "sfixed32",
    FieldType.TYPE_SFIXED64: "sfixed64",
    FieldType.TYPE_SINT32: "sint32",
    FieldType.TYPE_SINT64: "sint64",
}


class StaleReference(Exception):
    """API.md differs from what the .proto files render to."""


@dataclass(frozen=True)
class Declared:
    """A message or enum with its fully-qualified name and its source-location path."""

    full_name: str
    short_name: str
    proto: descriptor_pb2.DescriptorProto | descriptor_pb2.EnumDescriptorProto
    path: tuple[int, ...]
    file_name: str


def proto_sources() -> list[str]:
    return sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))


def compile_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Parse the .proto files with protoc, keeping comments (--include_source_info)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "descriptors.binpb"
        args = [
            "protoc",
            f"-I{PROTOS}",
            f"-I{WELL_KNOWN}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *proto_sources(),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed to parse the .proto files")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def comment_index(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    index = {}
    for location in file.source_code_info.location:
        parts = [clean_comment(location.leading_comments), clean_comment(location.trailing_comments)]
        text = "\n\n".join(part for part in parts if part)
        if text:
            index[tuple(location.path)] = text
    return index


def clean_comment(raw: str) -> str:
    """Strip protoc's one-space indent per line and surrounding blank lines."""
    lines = [line[1:] if line.startswith(" ") else line for line in raw.splitlines()]
    return "\n".join(line.rstrip() for line in lines).strip()


def as_paragraphs(comment: str) -> str:
    """Comment text as Markdown paragraphs: wrapped lines joined, blank lines kept, HTML escaped."""
    paragraphs = re.split(r"\n\s*\n", comment)
    joined = "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)
    return escape_html_outside_code(joined)


def escape_html_outside_code(text: str) -> str:
    """Escape < > & outside `code spans`, so text like "sha256:<hex>" is not eaten as an HTML tag."""
    pieces = text.split("`")
    for i in range(0, len(pieces), 2):
        pieces[i] = pieces[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


def as_cell(comment: str) -> str:
    """Comment text fitted into one Markdown table cell."""
    return as_paragraphs(comment).replace("|", "\\|").replace("\n\n", "<br><br>")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def walk_declarations(file: descriptor_pb2.FileDescriptorProto) -> Iterator[Declared]:
    """Every message and enum of a file, nested ones included, in source order."""
    package = f".{file.package}."

    def declared(full_name, proto, path):
        return Declared(full_name, full_name.removeprefix(package), proto, path, file.name)

    def walk_message(message, prefix, path):
        full = f"{prefix}.{message.name}"
        yield declared(full, message, path)
        for i, nested in enumerate(message.nested_type):
            yield from walk_message(nested, full, (*path, MESSAGE_NESTED, i))
        for i, enum in enumerate(message.enum_type):
            yield declared(f"{full}.{enum.name}", enum, (*path, MESSAGE_ENUM, i))

    for i, message in enumerate(file.message_type):
        yield from walk_message(message, f".{file.package}", (FILE_MESSAGE, i))
    for i, enum in enumerate(file.enum_type):
        yield declared(f".{file.package}.{enum.name}", enum, (FILE_ENUM, i))


class Renderer:
    def __init__(self, descriptor_set: descriptor_pb2.FileDescriptorSet):
        sources = set(proto_sources())
        self.files = sorted((f for f in descriptor_set.file if f.name in sources), key=lambda f: f.name)
        self.comments = {f.name: comment_index(f) for f in self.files}
        self.declared: dict[str, Declared] = {}
        for file in self.files:
            for item in walk_declarations(file):
                self.declared[item.full_name] = item
        self.map_entries = {
            name
            for name, item in self.declared.items()
            if isinstance(item.proto, descriptor_pb2.DescriptorProto) and item.proto.options.map_entry
        }
        self.used_by = self._rpc_usage()
        self._check_anchors()

    def _rpc_usage(self) -> dict[str, list[str]]:
        usage: dict[str, list[str]] = {}
        for file in self.files:
            for service in file.service:
                for method in service.method:
                    rpc = f"{service.name}.{method.name}"
                    usage.setdefault(method.input_type, []).append(f"request of {self.rpc_link(rpc)}")
                    usage.setdefault(method.output_type, []).append(f"response of {self.rpc_link(rpc)}")
        return usage

    def _check_anchors(self) -> None:
        headings = [s.name for f in self.files for s in f.service]
        headings += [f"{s.name}.{m.name}" for f in self.files for s in f.service for m in s.method]
        headings += [d.short_name for n, d in self.declared.items() if n not in self.map_entries]
        anchors = [github_anchor(h) for h in headings]
        duplicates = sorted({a for a in anchors if anchors.count(a) > 1})
        if duplicates:
            raise SystemExit(f"headings would share anchors {duplicates}; rename or extend apidoc.py")

    def comment(self, file_name: str, path: tuple[int, ...]) -> str:
        return self.comments[file_name].get(path, "")

    def rpc_link(self, rpc: str) -> str:
        return f"[`{rpc}`](#{github_anchor(rpc)})"

    def type_link(self, full_name: str) -> str:
        item = self.declared.get(full_name)
        if item is None:
            return f"`{full_name.lstrip('.')}`"
        return f"[`{item.short_name}`](#{github_anchor(item.short_name)})"

    def field_type(self, field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type_name in self.map_entries:
            entry = self.declared[field.type_name].proto
            key, value = entry.field
            if value.type not in (FieldType.TYPE_MESSAGE, FieldType.TYPE_ENUM):
                return f"`map<{SCALAR_NAMES[key.type]}, {SCALAR_NAMES[value.type]}>`"
            return f"map&lt;`{SCALAR_NAMES[key.type]}`, {self.field_type(value)}&gt;"
        if field.type in (FieldType.TYPE_MESSAGE, FieldType.TYPE_ENUM):
            name = self.type_link(field.type_name)
        else:
            name = f"`{SCALAR_NAMES[field.type]}`"
        if field.label == FieldType.LABEL_REPEATED:
            return f"repeated {name}"
        if field.proto3_optional:
            return f"optional {name}"
        return name

    def render(self) -> str:
        out = [
            "# checkpoint.v1 API reference",
            "",
            "<!-- Generated by protos/apidoc.py from the .proto files; do not edit. "
            "Run `make proto` after changing a .proto. -->",
            "",
            "Every comment below is copied from the `.proto` files under `protos/`, which are the",
            "contract. Field names are the proto names. In JSON (grpcurl, `buf curl`) a request may",
            "spell them either way (`plan_id` or `planId`); grpcurl prints the proto names, `buf curl`",
            "lowerCamelCase. Enum values travel as numbers on the wire and as names in JSON; int64",
            "values are JSON strings. Errors carry one `google.rpc.ErrorInfo` (domain `checkpointd`,",
            "reason from [`ErrorReason`](#errorreason) without its `ERROR_REASON_` prefix).",
            "",
            "Files: " + ", ".join(f"`{f.name}`" for f in self.files) + ".",
            "",
            "## Services",
            "",
        ]
        for file in self.files:
            for i, service in enumerate(file.service):
                out += self.render_service(file, service, (FILE_SERVICE, i))
        out += ["## Messages", ""]
        for file in self.files:
            for name, item in self.declared.items():
                is_message = isinstance(item.proto, descriptor_pb2.DescriptorProto)
                if item.file_name == file.name and is_message and name not in self.map_entries:
                    out += self.render_message(item)
        out += ["## Enums", ""]
        for file in self.files:
            for item in self.declared.values():
                if item.file_name == file.name and isinstance(item.proto, descriptor_pb2.EnumDescriptorProto):
                    out += self.render_enum(item)
        return "\n".join(out).rstrip("\n") + "\n"

    def render_service(self, file, service, path) -> list[str]:
        full = f"{file.package}.{service.name}"
        out = [f"### {service.name}", "", f"`{full}` — defined in `{file.name}`.", ""]
        text = self.comment(file.name, path)
        if text:
            out += [as_paragraphs(text), ""]
        out += ["| RPC | Request | Response |", "| --- | --- | --- |"]
        for method in service.method:
            request = self.type_link(method.input_type)
            response = self.type_link(method.output_type)
            request = f"stream {request}" if method.client_streaming else request
            response = f"stream {response}" if method.server_streaming else response
            out.append(f"| {self.rpc_link(f'{service.name}.{method.name}')} | {request} | {response} |")
        out.append("")
        for j, method in enumerate(service.method):
            out += [f"#### {service.name}.{method.name}", ""]
            out += [
                f"`rpc {method.name}({self.signature(method)})` — full method name `/{full}/{method.name}`.",
                "",
            ]
            text = self.comment(file.name, (*path, SERVICE_METHOD, j))
            if text:
                out += [as_paragraphs(text), ""]
        return out

    def signature(self, method) -> str:
        request = method.input_type.lstrip(".")
        response = method.output_type.lstrip(".")
        request = f"stream {request}" if method.client_streaming else request
        response = f"stream {response}" if method.server_streaming else response
        return f"{request}) returns ({response}"

    def render_message(self, item: Declared) -> list[str]:
        message = item.proto
        out = [
            f"### {item.short_name}",
            "",
            f"`{item.full_name.lstrip('.')}` — defined in `{item.file_name}`.",
        ]
        if item.full_name in self.used_by:
            out[-1] += " Used as the " + "; the ".join(self.used_by[item.full_name]) + "."
        out.append("")
        text = self.comment(item.file_name, item.path)
        if text:
            out += [as_paragraphs(text), ""]
        if not message.field:
            return [*out, "*No fields.*", ""]
        out += ["| Field | Number | Type | Description |", "| --- | --- | --- | --- |"]
        for j, field in enumerate(message.field):
            description = as_cell(self.comment(item.file_name, (*item.path, MESSAGE_FIELD, j)))
            if field.HasField("oneof_index") and not field.proto3_optional:
                oneof = message.oneof_decl[field.oneof_index].name
                description = f"Member of oneof `{oneof}`. {description}"
            out.append(f"| `{field.name}` | {field.number} | {self.field_type(field)} | {description} |")
        out.append("")
        return out

    def render_enum(self, item: Declared) -> list[str]:
        enum = item.proto
        out = [
            f"### {item.short_name}",
            "",
            f"`{item.full_name.lstrip('.')}` — defined in `{item.file_name}`.",
            "",
        ]
        text = self.comment(item.file_name, item.path)
        if text:
            out += [as_paragraphs(text), ""]
        out += ["| Name | Number | Description |", "| --- | --- | --- |"]
        for j, value in enumerate(enum.value):
            description = as_cell(self.comment(item.file_name, (*item.path, ENUM_VALUE, j)))
            out.append(f"| `{value.name}` | {value.number} | {description} |")
        out.append("")
        return out


def render() -> str:
    return Renderer(compile_descriptor_set()).render()


def check(path: pathlib.Path = OUTPUT) -> None:
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if current != render():
        raise StaleReference(f"{path} is out of date with the .proto files; run `make proto`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if API.md is stale instead of writing it")
    parser.add_argument("--output", type=pathlib.Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if args.check:
        try:
            check(args.output)
        except StaleReference as stale:
            print(stale, file=sys.stderr)
            return 1
        return 0
    args.output.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
