"""The container and manifests cannot run here (no Docker engine, no cluster), so they are
linted: parsed, and every promise the README makes about them checked — including that
each checkpointd command line in them is accepted by the real argument parser and passes
the server's own listener-security rule."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml

from checkpointd.cli import build_parser, server_settings
from checkpointd.listeners import is_loopback, parse_listen
from checkpointd.server import ServerSettings, check_listener_security

DEPLOY = Path(__file__).resolve().parents[2] / "service" / "deploy"
REPO = DEPLOY.parents[1]


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "dangling line continuation"
    return instructions


def _final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    return instructions[starts[-1]:]


def _env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(rest))
    return env


def _serve_args(args: list[str], env: dict[str, str], monkeypatch) -> ServerSettings:
    """What `checkpointd serve ARGS` would run with under ``env`` (the token file itself is not
    read: it exists only in the container), checked by the server's listener-security rule."""
    for key in [k for k in os.environ if k.startswith("CHECKPOINTD_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    parsed = build_parser().parse_args(["serve", *args])
    monkeypatch.setattr("checkpointd.serve_options._token",
                        lambda a: object() if a.token_file or os.environ.get("CHECKPOINTD_TOKEN") else None)
    settings = server_settings(parsed)
    check_listener_security([parse_listen(a) for a in settings.listen], settings)
    return settings


def test_dockerfile_is_multi_stage_non_root_with_serve_entrypoint_and_health_check(monkeypatch):
    instructions = _dockerfile_instructions()
    stages = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert len(stages) >= 2 and " AS build" in stages[0]
    final = _final_stage(instructions)
    assert any(k == "COPY" and rest.startswith("--from=build") for k, rest in final), "runtime copies build output"
    assert not any(k == "RUN" and "grpcio-tools" in rest for k, rest in final), "no build tools at runtime"
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    entrypoint = [json.loads(rest) for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entrypoint == [["checkpointd", "serve"]]
    healthchecks = [rest for keyword, rest in final if keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    probe = json.loads(healthchecks[0].split(" CMD ", 1)[1])
    assert probe[:2] == ["checkpointd", "health"]
    probe_args = build_parser().parse_args(probe[1:])
    settings = _serve_args([], _env(final), monkeypatch)
    assert probe_args.target in settings.listen, "the health check dials a listener the server has"
    assert all(a.startswith("unix:") or is_loopback(parse_listen(a).host) for a in settings.listen)
    assert settings.workspace_roots == ("/workspace",)


def test_dockerignore_keeps_local_state_out_of_the_context():
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {"**/.venv", "**/node_modules", ".git"} <= set(ignored)


def _k8s_documents() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_kubernetes_example_runs_checkpointd_as_a_native_sidecar(monkeypatch):
    docs = _k8s_documents()
    kustomization = next(d for d in docs if d["kind"] == "Kustomization")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    sidecar = next(c for c in pod["initContainers"] if c["name"] == "checkpointd")
    assert sidecar["restartPolicy"] == "Always"
    agent = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True

    settings = _serve_args(sidecar["args"], {}, monkeypatch)
    grpc_ports = {p["containerPort"] for p in sidecar["ports"] if p["name"] == "grpc"}
    tcp_ports = {parse_listen(a).port for a in settings.listen if not a.startswith("unix:")}
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert sidecar[kind]["grpc"]["port"] in grpc_ports & tcp_ports, kind
    assert pod["terminationGracePeriodSeconds"] > settings.grace_seconds
    assert settings.gc_interval_seconds > 0 and settings.metrics_listen

    def mounts(container) -> dict[str, str]:
        return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    volumes = {v["name"]: v for v in pod["volumes"]}
    sidecar_mounts, agent_mounts = mounts(sidecar), mounts(agent)
    for root in settings.workspace_roots:
        assert sidecar_mounts[root] == agent_mounts[root], "the workspace volume is shared"
    token_dir = str(Path(build_parser().parse_args(["serve", *sidecar["args"]]).token_file).parent)
    assert "secret" in volumes[sidecar_mounts[token_dir]]
    data_dir = str(settings.data_dir)
    assert data_dir in sidecar_mounts and data_dir not in agent_mounts
    target = next(e["value"] for e in agent["env"] if e["name"] == "CHECKPOINTD_TARGET")
    assert target in settings.listen
    socket_dir = str(Path(parse_listen(target).unix_path).parent)
    assert sidecar_mounts[socket_dir] == agent_mounts[socket_dir]
    token_env = next(e for e in agent["env"] if e["name"] == "CHECKPOINTD_TOKEN")
    assert token_env["valueFrom"]["secretKeyRef"]["name"] == volumes[sidecar_mounts[token_dir]]["secret"][
        "secretName"]
    claim = volumes[sidecar_mounts[data_dir]]["persistentVolumeClaim"]["claimName"]
    assert any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim for d in docs)


def test_compose_example(monkeypatch):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    server, agent = compose["services"]["checkpointd"], compose["services"]["agent"]
    build = server["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    image_env = _env(_final_stage(_dockerfile_instructions()))
    secret_path = "/run/secrets/" + server["secrets"][0]
    assert server["environment"]["CHECKPOINTD_TOKEN_FILE"] == secret_path
    settings = _serve_args(server["command"], {**image_env, **server["environment"]}, monkeypatch)
    assert server["healthcheck"]["test"][:3] == ["CMD", "checkpointd", "health"]
    probe = build_parser().parse_args(server["healthcheck"]["test"][2:])
    assert probe.target in settings.listen
    assert agent["network_mode"] == "service:checkpointd"
    assert agent["depends_on"]["checkpointd"]["condition"] == "service_healthy"
    assert agent["environment"]["CHECKPOINTD_TARGET"] in settings.listen
    shared = {v.split(":")[1]: v.split(":")[0] for v in server["volumes"]}
    agent_volumes = {v.split(":")[1]: v.split(":")[0] for v in agent["volumes"]}
    for root in settings.workspace_roots:
        assert shared[root] == agent_volumes[root]
    assert set(shared.values()) <= set(compose["volumes"])
    assert set(compose["secrets"]) == set(server["secrets"])


@pytest.mark.parametrize("name", ["deployment.yaml", "pvc.yaml", "kustomization.yaml"])
def test_manifests_have_api_version_and_kind(name):
    for doc in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()):
        assert doc["apiVersion"] and doc["kind"]
    assert REPO.joinpath("service", "deploy", "k8s", name).exists()
