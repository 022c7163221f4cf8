"""Fake servers for the iris-bench tests, on 127.0.0.1 port 0, each in its own thread:

* FakeOpenAIServer: an OpenAI-compatible /v1/chat/completions that streams SSE events in a
  chunked HTTP/1.1 response (one event per chunk, `chunk_gap_s` apart), then a usage event
  and [DONE]; requests whose text contains `fail_marker` get HTTP 500; with `token`, requests
  without "Authorization: Bearer <token>" get 401; with `tls_cert_key`, HTTPS.
* FakeIrisServer: Iris.Generate from the generated stubs (sync grpc server): streams
  `max_tokens` tokens, one GenerateResponse each, then a final message with usage.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import sys
import threading
import tempfile
import time
import unittest
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCH_DIR = os.path.join(REPO, "bench")
IRIS_BENCH = os.path.join(BENCH_DIR, "iris-bench")
ABLATION = os.path.join(BENCH_DIR, "ablation")

sys.dont_write_bytecode = True
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)


class NoThreadLeak:
    """unittest.TestCase mixin: every thread a test started has ended (within 5 s) after it."""

    def setUp(self):
        super().setUp()
        self._threads_before = set(threading.enumerate())

    def tearDown(self):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            extra = [t for t in threading.enumerate() if t not in self._threads_before and t.is_alive()]
            if not extra:
                break
            time.sleep(0.05)
        self.assertEqual(extra, [], "threads left running")
        super().tearDown()


class ServesModel:
    """unittest.TestCase mixin: one real iris-server per class on MODEL_DIR (a ctest fixture's
    model, FIXTURE names it; the class is skipped without it) with SERVER_ARGS, and a temporary
    folder `tmp`; after the class the server is stopped and must have exited cleanly."""

    MODEL_DIR = ""
    FIXTURE = ""
    SERVER_ARGS: tuple[str, ...] = ()

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        from iris_bench.server_proc import IrisServer
        if not os.path.isfile(os.path.join(cls.MODEL_DIR, "config.json")):
            raise unittest.SkipTest(f"no model at {cls.MODEL_DIR} (ctest fixture {cls.FIXTURE})")
        cls.server = IrisServer(os.environ["IRIS_SERVER_BIN"], [f"--model={cls.MODEL_DIR}", "--workers=2",
                                                                *cls.SERVER_ARGS], startup_timeout_s=120)
        cls.server.start()
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        cls.tmp.cleanup()
        if status != 0:
            raise AssertionError(f"iris-server exited with status {status}:\n{cls.server.log()[-3000:]}")
        super().tearDownClass()


def make_self_signed_cert(directory: str) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1/localhost made with the openssl CLI in
    ``directory``; returns (cert.pem, key.pem)."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def bench_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


class _OpenAIHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small timed chunks must leave at once

    def log_message(self, fmt, *args):  # quiet
        pass

    def _send_json(self, status: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with self.server.lock:
            self.server.peers.add(self.client_address)
        if self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": "not found"}})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        srv = self.server
        length = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(length))
        with srv.lock:
            srv.requests.append(req)
            srv.peers.add(self.client_address)
        if srv.token and self.headers.get("Authorization") != f"Bearer {srv.token}":
            self._send_json(401, {"error": {"message": "bad or missing token"}})
            return
        if self.path != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        content = req["messages"][0]["content"]
        text = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        images = [p for p in content if p.get("type") == "image_url"]
        for p in images:  # the image must be a decodable data URL
            url = p["image_url"]["url"]
            head, _, b64 = url.partition(",")
            assert head.startswith("data:image/") and head.endswith(";base64"), head
            base64.b64decode(b64, validate=True)
        if srv.fail_marker and srv.fail_marker in text:
            self._send_json(500, {"error": {"message": "fake failure", "type": "server_error"}})
            return
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": srv.model}
        # vLLM-style first event: the role, no content (must not count as the first token).
        self._chunk(b"data: " + json.dumps(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])).encode() + b"\n\n")
        for i in range(n):
            time.sleep(srv.chunk_gap_s)
            ev = dict(base, choices=[{"index": 0, "delta": {"content": f"w{i} "},
                                      "finish_reason": "length" if i == n - 1 else None}])
            self._chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
        prompt_tokens = 10 + len(text.split()) + 64 * len(images)
        usage = dict(base, choices=[], usage={"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                              "total_tokens": prompt_tokens + n})
        self._chunk(b": keep-alive comment\n\n")
        self._chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")  # the terminating zero-length chunk


class FakeOpenAIServer:
    def __init__(self, chunk_gap_s: float = 0.002, fail_marker: str = "", model: str = "fake-vl",
                 token: str = "", tls_cert_key=None):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OpenAIHandler)
        if tls_cert_key:
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls_cert_key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.token = token
        self.httpd.daemon_threads = True
        self.httpd.chunk_gap_s = chunk_gap_s
        self.httpd.fail_marker = fail_marker
        self.httpd.model = model
        self.httpd.lock = threading.Lock()
        self.httpd.requests = []
        self.httpd.peers = set()  # client (host, port) pairs: one per connection
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def requests(self):
        return self.httpd.requests

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


class FakeIrisServer:
    """Iris.Generate over the generated stubs; `fail_every` > 0 fails every n-th request
    with RESOURCE_EXHAUSTED."""

    def __init__(self, token_gap_s: float = 0.002, fail_every: int = 0, image_tokens: int = 100):
        import grpc
        from iris_bench.proto import load_stubs
        pb2, pb2_grpc = load_stubs()
        fake = self

        class Servicer(pb2_grpc.IrisServicer):
            def Generate(self, request, context):
                with fake.lock:
                    fake.requests.append(request)
                    n_req = len(fake.requests)
                if fail_every and n_req % fail_every == 0:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full (fake)")
                images = sum(1 for m in request.messages for p in m.content if p.HasField("image"))
                text = " ".join(p.text for m in request.messages for p in m.content if p.HasField("text"))
                n = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else 16
                for i in range(n):
                    time.sleep(token_gap_s)
                    yield pb2.GenerateResponse(request_id=request.request_id, text=f"t{i} ", token_ids=[100 + i])
                usage = pb2.Usage(prompt_tokens=20 + len(text.split()) + image_tokens * images,
                                  image_tokens=image_tokens * images, completion_tokens=n)
                yield pb2.GenerateResponse(request_id=request.request_id, final=pb2.Completion(
                    finish_reason=pb2.FINISH_REASON_LENGTH, usage=usage,
                    timings=pb2.Timings(total_ms=1.0)))

        self.lock = threading.Lock()
        self.requests = []
        self.executor = futures.ThreadPoolExecutor(max_workers=16)
        self.server = grpc.server(self.executor)
        pb2_grpc.add_IrisServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(grace=None).wait(10)
        self.executor.shutdown(wait=True)
