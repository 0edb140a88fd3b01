"""protos/API.md is generated from the .proto comments; these tests keep it from rotting."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import sys

import pytest
from google.protobuf import descriptor_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
APIDOC_PATH = REPO / "protos" / "apidoc.py"


def load_apidoc():
    spec = importlib.util.spec_from_file_location("checkpointd_apidoc", APIDOC_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


apidoc = load_apidoc()


@pytest.fixture(scope="module")
def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    return apidoc.compile_descriptor_set()


@pytest.fixture(scope="module")
def rendered(descriptor_set) -> str:
    return apidoc.Renderer(descriptor_set).render()


def test_committed_api_reference_matches_the_protos(rendered):
    committed = (REPO / "protos" / "API.md").read_text(encoding="utf-8")
    assert committed == rendered, "protos/API.md is stale: run `make proto` and commit protos/API.md"


def test_render_is_deterministic(rendered):
    assert apidoc.render() == rendered


def test_check_reports_a_stale_reference(tmp_path):
    stale = tmp_path / "API.md"
    shutil.copy(REPO / "protos" / "API.md", stale)
    stale.write_text(stale.read_text(encoding="utf-8").replace("Output only.", "Output-only.", 1))
    with pytest.raises(apidoc.StaleReference):
        apidoc.check(stale)
    assert apidoc.main(["--check", "--output", str(stale)]) == 1


def our_files(descriptor_set):
    return [f for f in descriptor_set.file if f.package == "checkpoint.v1"]


def test_every_rpc_message_field_and_enum_value_is_documented(descriptor_set, rendered):
    """Each element appears in API.md with the comment the .proto gives it."""
    files = our_files(descriptor_set)
    assert files, "no checkpoint.v1 files were compiled"
    for file in files:
        comments = apidoc.comment_index(file)
        for s, service in enumerate(file.service):
            assert f"### {service.name}\n" in rendered
            for m, method in enumerate(service.method):
                assert f"#### {service.name}.{method.name}\n" in rendered
                comment = comments.get((apidoc.FILE_SERVICE, s, apidoc.SERVICE_METHOD, m), "")
                assert comment, f"rpc {service.name}.{method.name} has no comment"
                assert apidoc.as_paragraphs(comment) in rendered
        for item in apidoc.walk_declarations(file):
            if isinstance(item.proto, descriptor_pb2.DescriptorProto):
                if item.proto.options.map_entry:
                    continue
                assert f"### {item.short_name}\n" in rendered
                for j, field in enumerate(item.proto.field):
                    comment = comments.get((*item.path, apidoc.MESSAGE_FIELD, j), "")
                    assert comment, f"field {item.short_name}.{field.name} has no comment"
                    assert f"| `{field.name}` | {field.number} |" in rendered
                    assert apidoc.as_cell(comment) in rendered
            else:
                assert f"### {item.short_name}\n" in rendered
                for j, value in enumerate(item.proto.value):
                    comment = comments.get((*item.path, apidoc.ENUM_VALUE, j), "")
                    assert comment, f"enum value {value.name} has no comment"
                    assert f"| `{value.name}` | {value.number} | {apidoc.as_cell(comment)} |" in rendered


def test_enum_zero_values_are_unspecified(descriptor_set):
    for file in our_files(descriptor_set):
        for item in apidoc.walk_declarations(file):
            if isinstance(item.proto, descriptor_pb2.EnumDescriptorProto):
                zero = item.proto.value[0]
                assert zero.number == 0 and zero.name.endswith("_UNSPECIFIED"), item.full_name


def test_comment_text_cannot_break_the_markdown():
    assert apidoc.as_cell('digest "sha256:<hex>" | more') == 'digest "sha256:&lt;hex&gt;" \\| more'
    assert apidoc.as_paragraphs("keep `a<b` as code") == "keep `a<b` as code"
