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
