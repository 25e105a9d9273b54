"""`dmem up`'s choices without starting anything: the Milvus mode and the first screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.local.stack import LocalStack, first_screen


def test_first_screen_tells_how_to_publish() -> None:
    text = first_screen({"kafka": "127.0.0.1:9999", "http": "http://127.0.0.1:7777",
                         "milvus": "http://127.0.0.1:19530", "milvus_mode": "server",
                         "data_dir": "/d"})  # fmt: skip
    assert "curl -sX POST http://127.0.0.1:7777/v1/transitions" in text
    assert 'SyncClient("127.0.0.1:9999"' in text
    assert "kcat -P -b 127.0.0.1:9999 -t dmem.transitions" in text
    assert "http://127.0.0.1:7777/openapi.json" in text and "librdkafka >= 2.2" in text
    assert "token=" not in text and "Bearer" not in text
    # how an operator's commands find this stack
    assert (
        "export DMEM_KAFKA__BROKER=127.0.0.1:9999 DMEM_MILVUS__URI=http://127.0.0.1:19530" in text
    )


def test_first_screen_with_auth_on_passes_the_token_in_every_example() -> None:
    text = first_screen({"kafka": "127.0.0.1:9999", "http": "http://127.0.0.1:7777",
                         "milvus": "m.db", "milvus_mode": "lite", "data_dir": "/d",
                         "auth": "on (2 tokens; send Authorization: Bearer <token>)"})  # fmt: skip
    assert text.count("-H 'Authorization: Bearer <token>'") == 2  # publish and search
    assert 'http_url="http://127.0.0.1:7777", token="<token>")' in text
    assert "kcat's are" in text and "unauthenticated" in text
    assert "export DMEM_KAFKA__BROKER=127.0.0.1:9999 DMEM_DATA_DIR=/d DMEM_WEB_PORT=7777" in text
    assert "Milvus Lite is this process's file" in text  # no URI another process can open


def test_milvus_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DMEM_MILVUS__URI", raising=False)
    assert LocalStack(tmp_path / "a", milvus="lite").milvus_mode() == "lite"
    ext = LocalStack(tmp_path / "b", milvus="auto", extra_env={"DMEM_MILVUS__URI": "http://x:1"})
    assert ext.milvus_mode() == "external"
    monkeypatch.setenv("DMEM_MILVUS_SERVER_DIR", str(tmp_path / "no-wheel"))
    assert LocalStack(tmp_path / "c", milvus="auto").milvus_mode() == "lite"
    with pytest.raises(Exception, match="milvus==2.3.5"):
        LocalStack(tmp_path / "d", milvus="server").milvus_mode()
    with pytest.raises(ValueError):
        LocalStack(tmp_path / "e", milvus="docker")


def test_auto_keeps_a_data_dir_on_lite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "wheel"  # what `EmbeddedMilvusServer.check_installed` looks for
    (wheel / "milvus" / "data" / "bin").mkdir(parents=True)
    (wheel / "milvus" / "__init__.py").write_text("")
    monkeypatch.setenv("DMEM_MILVUS_SERVER_DIR", str(wheel))
    monkeypatch.delenv("DMEM_MILVUS__URI", raising=False)
    data = tmp_path / "data"
    data.mkdir()
    stack = LocalStack(data, milvus="auto")
    assert stack.milvus_mode() == "server"
    (data / "milvus.db").write_bytes(b"")  # Lite data and no server data: stay on Lite
    assert stack.milvus_mode() == "lite"


def test_up_uses_the_users_auth_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("DMEM_AUTH__TOKENS", "DMEM_AUTH__DISABLED", "DMEM_AUTH__TOKENS_FILE"):
        monkeypatch.delenv(k, raising=False)
    stack = LocalStack(tmp_path)
    assert stack.env(1)["DMEM_AUTH__DISABLED"] == "true"  # nothing configured: off, and said
    assert stack.auth_summary().startswith("off (no DMEM_AUTH__TOKENS set")
    monkeypatch.setenv("DMEM_AUTH__TOKENS", '{"tok-a": ["a"], "tok-b": ["b"]}')
    assert "DMEM_AUTH__DISABLED" not in stack.env(1)  # the user's tokens are used
    assert not stack.settings.auth.disabled and set(stack.settings.auth.tokens) == {
        "tok-a",
        "tok-b",
    }
    assert stack.auth_summary().startswith("on (2 tokens")
    assert "no ACLs" in stack.auth_summary()  # what the tokens do not protect
    monkeypatch.setenv("DMEM_AUTH__DISABLED", "true")
    assert stack.auth_summary().startswith("off (DMEM_AUTH__DISABLED")


def test_first_screen_says_whether_auth_is_on() -> None:
    info = {
        "kafka": "k:1",
        "http": "http://h:2",
        "milvus": "m",
        "milvus_mode": "server",
        "data_dir": "/d",
        "auth": "on (2 tokens; send Authorization: Bearer <token>)",
    }
    text = first_screen(info)
    assert "auth    on (2 tokens" in text
    # every POST example sends its JSON type (the server refuses others with 415)
    posts = [line for line in text.splitlines() if "curl -sX POST" in line]
    assert posts and all("Content-Type: application/json" in p for p in posts)
    assert all("Authorization: Bearer <token>" in p for p in posts)
    off = first_screen({**info, "auth": "off (no DMEM_AUTH__TOKENS set: ...)"})
    assert "Authorization" not in off


def test_a_second_dmem_up_on_a_data_dir_in_use_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it started anyway: its worker could not open the first one's Milvus Lite file
    # (health not ok, every search 503), and stopping, it removed the first one's up.json
    import fcntl
    import os

    from schemas.errors import ConfigError
    from streams.local import stack as stack_mod

    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path / "d" / "up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the running one holds it
    try:

        def no_start(self: LocalStack) -> None:
            raise AssertionError("nothing may start")

        monkeypatch.setattr(LocalStack, "start", no_start)
        with pytest.raises(ConfigError, match="in use by another dmem up"):
            stack_mod.run_up(tmp_path / "d", as_json=True, milvus="lite")
    finally:
        os.close(fd)  # released: a later one may take it
    from streams.local.announce import hold_data_dir

    os.close(hold_data_dir(tmp_path / "d"))


def test_a_fixed_port_in_use_is_refused_naming_the_option() -> None:
    import socket

    from schemas.errors import ConfigError
    from streams.local.stack import check_port_free

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--http-port {port}: 127.0.0.1:{port} is in use"):
            check_port_free(port, "--http-port")
    check_port_free(port, "--http-port")  # free again: no error


def test_dmem_up_passes_its_fixed_ports_to_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.local import stack as stack_mod

    seen: dict[str, object] = {}

    def no_start(self: LocalStack) -> None:
        seen.update(kafka=self.kafka_port, http=self.http_port)
        raise RuntimeError("stop here")

    monkeypatch.setattr(LocalStack, "start", no_start)
    with pytest.raises(RuntimeError, match="stop here"):
        stack_mod.run_up(tmp_path / "d", as_json=True, milvus="lite", kafka_port=41000,
                         http_port=41001)  # fmt: skip
    assert seen == {"kafka": 41000, "http": 41001}
