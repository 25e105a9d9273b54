"""The embedded bench's timed calls reuse one connection, and survive a closed one."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dmem_bench.embedded import KeepAlive


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    ports: list[int] = []
    paths: list[str] = []
    close_next = False
    drop_next = False

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        _Handler.paths.append(self.path)
        if _Handler.drop_next:  # read the request, close without an answer
            _Handler.drop_next = False
            self.close_connection = True
            return
        if self.path == "/slow":
            time.sleep(1.0)
        _Handler.ports.append(self.client_address[1])
        out = json.dumps({"got": body.decode() or None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("Server-Timing", "total;dur=1.5")
        if _Handler.close_next:
            self.send_header("Connection", "close")
            self.close_connection = True
            _Handler.close_next = False
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base() -> Iterator[str]:
    _Handler.ports, _Handler.paths = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_calls_share_one_connection(base: str) -> None:
    keep = KeepAlive()
    for i in range(3):
        code, payload, headers = keep.request(base, "POST", "/x", f"q{i}".encode(), 5.0)
        assert code == 200 and json.loads(payload) == {"got": f"q{i}"}
    assert headers.get("Server-Timing") == "total;dur=1.5"
    assert len(_Handler.ports) == 3 and len(set(_Handler.ports)) == 1
    keep.close()


def test_a_connection_the_server_closed_is_reopened(base: str) -> None:
    keep = KeepAlive()
    _Handler.close_next = True
    assert keep.request(base, "GET", "/a", None, 5.0)[0] == 200
    assert keep.request(base, "GET", "/b", None, 5.0)[0] == 200
    assert len(set(_Handler.ports)) == 2  # the second call needed a new connection
    keep.close()


def test_a_reused_connection_dropped_unanswered_is_retried_once(base: str) -> None:
    keep = KeepAlive()
    assert keep.request(base, "GET", "/a", None, 5.0)[0] == 200
    _Handler.drop_next = True  # the next request on the kept connection goes unanswered
    code, payload, _ = keep.request(base, "GET", "/b", None, 5.0)
    assert code == 200 and json.loads(payload) == {"got": None}
    assert _Handler.paths == ["/a", "/b", "/b"]  # sent again, on a new connection
    assert len(set(_Handler.ports)) == 2
    keep.close()


def test_a_timed_out_post_is_not_sent_twice(base: str) -> None:
    keep = KeepAlive()
    assert keep.request(base, "GET", "/a", None, 0.2)[0] == 200  # opened with a short timeout
    with pytest.raises(TimeoutError):
        keep.request(base, "POST", "/slow", b"once", 0.3)
    assert _Handler.paths == ["/a", "/slow"]
    # a later call gets its own timeout, not the connection's first one
    assert keep.request(base, "POST", "/slow", b"again", 5.0)[0] == 200
    keep.close()
