"""Listener security against real servers: bearer token over TCP and the unix socket,
which services stay open, refusing an unauthenticated remote listener, socket permissions,
TLS and mutual TLS."""

from __future__ import annotations

import os
import socket
import stat

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from ulid import ULID

from checkpoint.v1 import admin_service_pb2 as admin_pb
from checkpoint.v1 import admin_service_pb2_grpc as admin_grpc
from checkpoint.v1 import checkpoint_service_pb2 as pb
from checkpoint.v1 import checkpoint_service_pb2_grpc as pb_grpc
from checkpointd_client import Checkpointd, CheckpointdRpcError
from tests.conftest import free_port
from tests.helpers import error_info
from tests.ops.conftest import TOKEN, run_cli, server_exit, wait_until


def _list(channel: grpc.Channel, token: str | None = None) -> pb.ListCheckpointsResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    return pb_grpc.CheckpointServiceStub(channel).ListCheckpoints(
        pb.ListCheckpointsRequest(plan_id=str(ULID())), timeout=10, metadata=metadata)


def _reflect(channel: grpc.Channel, token: str | None = None) -> list[str]:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                        timeout=10, metadata=metadata)
    return [s.name for reply in replies for s in reply.list_services_response.service]


def _assert_unauthenticated(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    info = error_info(caught.value)
    assert (info.domain, info.reason) == ("checkpointd", "UNAUTHENTICATED")
    return caught.value


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_token_is_required_on_every_listener(ops_server, token_file, transport):
    server = ops_server("--token-file", str(token_file))
    target = server.tcp_target if transport == "tcp" else server.unix_target
    with server.channel(target) as channel:
        missing = _assert_unauthenticated(lambda: _list(channel))
        assert "Bearer" in missing.details()
        wrong = _assert_unauthenticated(lambda: _list(channel, "ops-test-token-0123456789abcdeX"))
        assert "not valid" in wrong.details()
        _assert_unauthenticated(lambda: _list(channel, ""))
        assert list(_list(channel, TOKEN).checkpoints) == []
        # Health stays open by default (probes carry no token); reflection does not.
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        _assert_unauthenticated(lambda: _reflect(channel))
        assert "checkpoint.v1.CheckpointService" in _reflect(channel, TOKEN)


def test_token_from_the_environment_and_exempt_services_by_flag(ops_server):
    server = ops_server("--auth-exempt", "reflection", env={"CHECKPOINTD_TOKEN": TOKEN})
    with server.channel() as channel:
        _assert_unauthenticated(lambda: _list(channel))
        assert list(_list(channel, TOKEN).checkpoints) == []
        assert "checkpoint.v1.CheckpointService" in _reflect(channel)
        _assert_unauthenticated(
            lambda: health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10))


def test_a_rotated_token_file_takes_effect_without_restart(ops_server, token_file):
    server = ops_server("--token-file", str(token_file))
    new_token = "rotated-token-abcdefghijklmnop"
    replacement = token_file.with_name("token.new")
    replacement.write_text(new_token)
    os.replace(replacement, token_file)

    def accepts_new_token() -> bool:
        try:
            with server.channel() as channel:
                _list(channel, new_token)
            return True
        except grpc.RpcError as error:
            assert error.code() is grpc.StatusCode.UNAUTHENTICATED
            return False

    wait_until(accepts_new_token, "the rotated token to be accepted")
    with server.channel() as channel:
        _assert_unauthenticated(lambda: _list(channel, TOKEN))


def test_a_remote_listener_refuses_to_start_without_authentication(short_tmp, token_file):
    base = short_tmp / "remote"
    common = ["--data-dir", str(base / "data"), "--workspace-root", str(base)]
    refused = server_exit(["--listen", f"0.0.0.0:{free_port()}", *common])
    assert refused.returncode == 2
    assert "without authentication" in refused.stderr and "--allow-unauthenticated-remote" in refused.stderr
    assert not (base / "data").exists(), "nothing may be created before the refusal"
    empty = server_exit(["--listen", f"127.0.0.1:{free_port()}", *common], env={"CHECKPOINTD_TOKEN": ""})
    assert empty.returncode == 2 and "is empty" in empty.stderr
    short = server_exit(["--listen", f"127.0.0.1:{free_port()}", *common], env={"CHECKPOINTD_TOKEN": "short"})
    assert short.returncode == 2 and "shorter than 16" in short.stderr


@pytest.mark.parametrize("how", ["token", "allow-flag"])
def test_a_remote_listener_starts_with_a_token_or_when_explicitly_allowed(ops_server, token_file, how):
    port = free_port()
    args = ("--token-file", str(token_file)) if how == "token" else ("--allow-unauthenticated-remote",)
    server = ops_server(*args, listen=(f"0.0.0.0:{port}",))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert list(_list(channel, TOKEN if how == "token" else None).checkpoints) == []
    assert "0.0.0.0:" in server.log()


def test_unix_socket_permissions_default_and_configured(ops_server):
    default = ops_server()
    assert stat.S_IMODE(os.stat(default.socket_path).st_mode) == 0o660
    private = ops_server("--socket-mode", "0600")
    assert stat.S_IMODE(os.stat(private.socket_path).st_mode) == 0o600
    invalid = server_exit(["--socket-mode", "999", "--listen", "unix:///tmp/never.sock"])
    assert invalid.returncode == 2 and "octal permission mode" in invalid.stderr


def test_stale_socket_is_replaced_and_a_live_one_is_not_stolen(ops_server, short_tmp):
    stale = short_tmp / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()
    assert stale.exists()
    server = ops_server(listen=(f"unix://{stale}",))
    with grpc.insecure_channel(f"unix://{stale}") as channel:
        assert list(_list(channel).checkpoints) == []
    taken = server_exit(["--listen", f"unix://{stale}", "--data-dir", str(short_tmp / "other"),
                         "--workspace-root", str(short_tmp)])
    assert taken.returncode == 2 and "another server is listening" in taken.stderr
    assert server.process.poll() is None


def test_tls_listener(ops_server, pki):
    server = ops_server("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                        credentials=pki.channel_credentials(with_client_cert=False))
    with server.channel() as channel:
        assert list(_list(channel).checkpoints) == []
    with grpc.insecure_channel(server.tcp_target) as plaintext, pytest.raises(grpc.RpcError) as caught:
        _list(plaintext)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    distrusted = grpc.ssl_channel_credentials(root_certificates=pki.other_ca.read_bytes())
    with grpc.secure_channel(server.tcp_target, distrusted) as channel, pytest.raises(grpc.RpcError) as caught:
        _list(channel)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    # The unix socket stays plaintext: its file permissions are its protection.
    with grpc.insecure_channel(server.unix_target) as channel:
        assert list(_list(channel).checkpoints) == []


def test_mutual_tls_authenticates_a_remote_listener(ops_server, pki):
    port = free_port()
    server = ops_server("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                        "--tls-client-ca", str(pki.ca), listen=(f"0.0.0.0:{port}",),
                        credentials=pki.channel_credentials(with_client_cert=True))
    with server.channel() as channel:
        assert list(_list(channel).checkpoints) == []
    anonymous = pki.channel_credentials(with_client_cert=False)
    with grpc.secure_channel(f"127.0.0.1:{port}", anonymous) as channel, pytest.raises(grpc.RpcError) as caught:
        _list(channel)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    tls = ["--target", f"127.0.0.1:{port}", "--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert),
           "--tls-key", str(pki.client_key)]
    healthy = run_cli("health", *tls)
    assert healthy.returncode == 0, healthy.stderr
    assert "SERVING" in healthy.stdout
    listed = run_cli("ls", str(ULID()), "--json", *tls)
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    no_cert = run_cli("health", "--target", f"127.0.0.1:{port}", "--tls-ca", str(pki.ca))
    assert no_cert.returncode == 1


def test_tls_options_are_checked_at_start(short_tmp, pki):
    half = server_exit(["--tls-cert", str(pki.server_cert), "--listen", f"127.0.0.1:{free_port()}",
                        "--data-dir", str(short_tmp / "tls-half")])
    assert half.returncode == 2 and "go together" in half.stderr


def test_python_client_over_mutual_tls(ops_server, pki):
    """The typed client and its config watcher work over TLS with a client certificate, check
    the server's name, and get UNAVAILABLE (not a hang, not plaintext) when TLS is missing."""
    server = ops_server("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                        "--tls-client-ca", str(pki.ca), credentials=pki.channel_credentials(with_client_cert=True))
    plan_id = str(ULID())
    with Checkpointd(server.tcp_target, credentials=pki.channel_credentials(with_client_cert=True),
                     server_name="localhost", deadline_s=10) as agent:
        assert agent.settings.fetched, "the config watcher read nothing over TLS"
        created = agent.checkpoints.create_checkpoint(plan_id, description="over mTLS", state=b"s")
        assert [c.checkpoint_id for c in agent.checkpoints.list_checkpoints(plan_id)] == [created.checkpoint_id]
    refused = {
        "plaintext": {},
        "no client certificate": {"credentials": pki.channel_credentials(with_client_cert=False)},
        "another name in the certificate": {"credentials": pki.channel_credentials(with_client_cert=True),
                                            "server_name": "elsewhere.example"},
    }
    for why, options in refused.items():
        with Checkpointd(server.tcp_target, watch_config=False, deadline_s=5, **options) as agent:
            with pytest.raises(CheckpointdRpcError) as caught:
                agent.checkpoints.list_checkpoints(plan_id)
            assert caught.value.code is grpc.StatusCode.UNAVAILABLE, why


def test_cli_refuses_a_bad_target_or_tls_options_that_cannot_work_in_one_line(pki, short_tmp):
    cases = {
        ("--target", "foo"): "target must be host:port",
        ("--target", f"unix://{short_tmp}/x.sock", "--tls-ca", str(pki.ca)): "unix sockets in plaintext",
        ("--target", "127.0.0.1:1", "--tls-server-name", "localhost"): "--tls-server-name needs TLS",
    }
    for options, message in cases.items():
        refused = run_cli("ls", str(ULID()), *options)
        assert refused.returncode == 1, (options, refused.stderr)
        assert message in refused.stderr and "Traceback" not in refused.stderr, (options, refused.stderr)


def test_the_admin_service_needs_the_token_like_every_other(ops_server, token_file):
    server = ops_server("--token-file", str(token_file))
    with server.channel() as channel:
        stub = admin_grpc.AdminServiceStub(channel)
        _assert_unauthenticated(lambda: stub.CheckIntegrity(admin_pb.CheckIntegrityRequest(), timeout=30))
        reply = stub.CheckIntegrity(admin_pb.CheckIntegrityRequest(), timeout=30,
                                    metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert reply.ok
    refused = run_cli("fsck", "--target", server.tcp_target, env={"CHECKPOINTD_TOKEN": ""})
    assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
    checked = run_cli("fsck", "--target", server.tcp_target, "--token-file", str(token_file))
    assert checked.returncode == 0, checked.stdout + checked.stderr
