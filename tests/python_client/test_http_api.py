"""iris-server's OpenAI-compatible HTTP front (--http-port) on the tiny model: replies and SSE
chunks shaped as OpenAI's and equal to the gRPC replies, every error case with its status and
an OpenAI error object (driven by curl), auth, body limit, queue full, draining, /metrics
accepted by promtool, and 200 concurrent streams with 20 clients leaving mid-stream.

Needs IRIS_SERVER_BIN, IRIS_TEST_MODELS (the model_tiny fixture), IRIS_TEST_DATA, curl.
Run one group: ``test_http_api.py -v HttpErrorsTest``.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from iris_test_util import ServerProcess, data_path, env_path, make_self_signed_cert, tiny_model  # noqa: E402

from iris_client import Client  # noqa: E402

SERVER_BIN = env_path("IRIS_SERVER_BIN")
IMAGE = data_path("images", "rgb_300x200.png")
HTTP_RE = re.compile(r"iris-server: HTTP listening on \S+:(\d+)")
METRICS_RE = re.compile(r"iris-server: metrics listening on \S+:(\d+)")


def start_server(*args: str) -> tuple[ServerProcess, int]:
    """A server with the HTTP front on a free port; returns it and the HTTP port."""
    if SERVER_BIN is None:
        raise unittest.SkipTest("IRIS_SERVER_BIN is not set")
    server = ServerProcess(SERVER_BIN, ["--model", tiny_model(), "--port", "0", "--http-port", "0",
                                        "--dtype", "f32", *args])
    match = HTTP_RE.search(server.stderr())
    assert match, server.stderr()
    return server, int(match.group(1))


def image_url(path: str = IMAGE) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


def chat_body(**extra: object) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_url()}},
        {"type": "text", "text": "Describe this image."}]}],
        "max_tokens": 12, "temperature": 0}
    body.update(extra)
    return body


def request(port: int, method: str, path: str, body: object = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One HTTP request over http.client: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload


def sse_events(payload: bytes) -> list[str]:
    return [line[len("data: "):] for line in payload.decode().split("\n") if line.startswith("data: ")]


def curl(port: int, path: str, *args: str, data: str | None = None) -> tuple[int, dict]:
    """curl's status code and the parsed JSON body."""
    with tempfile.NamedTemporaryFile() as out:
        cmd = ["curl", "-s", "-o", out.name, "-w", "%{http_code}", *args]
        if data is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", data]
        run = subprocess.run(cmd + [f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True,
                             timeout=60)
        body = open(out.name, "rb").read()
    status = int(run.stdout or 0)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"raw": body.decode(errors="replace")}


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    if match is None:
        raise AssertionError(f"{name} not in /metrics")
    return float(match.group(1))


class HttpTestCase(unittest.TestCase):
    server_args: tuple[str, ...] = ()
    server: ServerProcess
    port: int

    @classmethod
    def setUpClass(cls) -> None:
        if shutil.which("curl") is None:
            raise unittest.SkipTest("curl is not installed")
        cls.server, cls.port = start_server(*cls.server_args)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def assertError(self, status: int, body: dict, want_status: int, param: str | None = None,
                    message: str | None = None) -> None:
        self.assertEqual(status, want_status, body)
        self.assertEqual(set(body), {"error"}, body)
        error = body["error"]
        self.assertEqual(set(error), {"message", "type", "param", "code"}, body)
        self.assertIsInstance(error["message"], str)
        self.assertTrue(error["message"])
        if param is not None:
            self.assertEqual(error["param"], param, body)
        if message is not None:
            self.assertIn(message, error["message"])


class HttpApiTest(HttpTestCase):
    """Shapes, and equality with the gRPC front for the same greedy request."""

    def grpc_reply(self, max_tokens: int = 12):
        with Client(self.server.target, timeout=60) as client:
            return client.generate(images=[IMAGE], text="Describe this image.", max_tokens=max_tokens)

    def test_chat_reply_shape_and_text_equal_grpc(self):
        status, headers, payload = request(self.port, "POST", "/v1/chat/completions", chat_body())
        self.assertEqual(status, 200, payload)
        self.assertEqual(headers["content-type"], "application/json")
        body = json.loads(payload)
        self.assertEqual(set(body), {"id", "object", "created", "model", "choices", "usage"})
        self.assertEqual(body["object"], "chat.completion")
        self.assertTrue(body["id"].startswith("chatcmpl-"))
        self.assertEqual(body["model"], "tiny")
        self.assertLess(abs(body["created"] - time.time()), 60)
        (choice,) = body["choices"]
        self.assertEqual(choice["index"], 0)
        self.assertEqual(choice["message"]["role"], "assistant")
        expected = self.grpc_reply()
        self.assertEqual(choice["message"]["content"], expected.text)
        self.assertEqual(choice["finish_reason"], expected.finish_reason)
        usage = body["usage"]
        self.assertEqual(usage["prompt_tokens"], expected.usage.prompt_tokens)
        self.assertEqual(usage["completion_tokens"], expected.usage.completion_tokens)
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
        self.assertEqual(usage["prompt_tokens_details"]["image_tokens"], expected.usage.image_tokens)
        self.assertGreater(expected.usage.image_tokens, 0)

    def test_stream_chunks_shape_and_text_equal_grpc(self):
        status, headers, payload = request(self.port, "POST", "/v1/chat/completions",
                                           chat_body(stream=True, stream_options={"include_usage": True}))
        self.assertEqual(status, 200, payload)
        self.assertTrue(headers["content-type"].startswith("text/event-stream"))
        events = sse_events(payload)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        ids = {c["id"] for c in chunks}
        self.assertEqual(len(ids), 1)
        for c in chunks:
            self.assertEqual(c["object"], "chat.completion.chunk")
            self.assertEqual(c["model"], "tiny")
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        usage_chunk = chunks[-1]
        self.assertEqual(usage_chunk["choices"], [])
        finish_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        self.assertEqual(len(finish_chunks), 1)
        self.assertIs(finish_chunks[0], chunks[-2])
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        expected = self.grpc_reply()
        self.assertEqual(text, expected.text)
        self.assertEqual(finish_chunks[0]["choices"][0]["finish_reason"], expected.finish_reason)
        self.assertEqual(usage_chunk["usage"]["completion_tokens"], expected.usage.completion_tokens)

    def test_stream_without_usage_has_no_usage_chunk(self):
        status, _, payload = request(self.port, "POST", "/v1/chat/completions", chat_body(stream=True))
        self.assertEqual(status, 200)
        chunks = [json.loads(e) for e in sse_events(payload)[:-1]]
        self.assertTrue(all("usage" not in c for c in chunks))
        self.assertTrue(chunks[-1]["choices"][0]["finish_reason"])

    def test_completions_and_string_content(self):
        status, _, payload = request(self.port, "POST", "/v1/completions",
                                     {"prompt": "Hello there", "max_tokens": 5, "ignore_eos": True})
        self.assertEqual(status, 200, payload)
        body = json.loads(payload)
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"]["completion_tokens"], 5)
        # The completions prompt is one user turn: the same as a chat with string content.
        status, _, chat = request(self.port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 5, "ignore_eos": True})
        self.assertEqual(json.loads(chat)["choices"][0]["message"]["content"], body["choices"][0]["text"])

    def test_stop_and_max_completion_tokens(self):
        _, _, payload = request(self.port, "POST", "/v1/chat/completions", chat_body(max_tokens=12))
        full = json.loads(payload)["choices"][0]["message"]["content"]
        _, _, payload = request(self.port, "POST", "/v1/chat/completions",
                                chat_body(max_tokens=100, max_completion_tokens=3))
        self.assertEqual(json.loads(payload)["usage"]["completion_tokens"], 3)
        stop = full[len(full) // 2:len(full) // 2 + 3]
        if stop.strip():
            _, _, payload = request(self.port, "POST", "/v1/chat/completions", chat_body(stop=[stop]))
            body = json.loads(payload)
            self.assertEqual(body["choices"][0]["finish_reason"], "stop")
            self.assertEqual(body["choices"][0]["message"]["content"], full[:full.index(stop)])

    def test_min_tokens_masks_the_stop_id(self):
        with Client(self.server.target, timeout=60) as client:
            first = client.generate(text="Hello there", max_tokens=1).token_ids[0]
        body = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
                "stop_token_ids": [first]}
        stopped = json.loads(request(self.port, "POST", "/v1/chat/completions", body)[2])
        self.assertEqual(stopped["choices"][0]["finish_reason"], "stop")
        self.assertLessEqual(stopped["usage"]["completion_tokens"], 1)
        body["min_tokens"] = 3
        held = json.loads(request(self.port, "POST", "/v1/chat/completions", body)[2])
        self.assertGreaterEqual(held["usage"]["completion_tokens"], 3)
        self.assertTrue(held["choices"][0]["message"]["content"])

    def test_seeded_sampling_is_reproducible(self):
        body = chat_body(temperature=1.0, top_p=0.9, top_k=50, seed=7, max_tokens=8)
        first = json.loads(request(self.port, "POST", "/v1/chat/completions", body)[2])
        second = json.loads(request(self.port, "POST", "/v1/chat/completions", body)[2])
        self.assertEqual(first["choices"][0]["message"], second["choices"][0]["message"])

    def test_models_health_and_request_id(self):
        status, _, payload = request(self.port, "GET", "/v1/models")
        self.assertEqual(status, 200)
        models = json.loads(payload)
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], ["tiny"])
        self.assertEqual(request(self.port, "GET", "/health")[0], 200)
        status, headers, payload = request(self.port, "POST", "/v1/chat/completions", chat_body(max_tokens=2),
                                           headers={"X-Request-Id": "http-id-1"})
        self.assertEqual(headers["x-request-id"], "http-id-1")
        self.assertEqual(json.loads(payload)["id"], "chatcmpl-http-id-1")
        deadline = time.monotonic() + 10  # the log line is read from the server's stderr by a thread
        while "request id=http-id-1 status=OK" not in self.server.stderr() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn("request id=http-id-1 status=OK", self.server.stderr())

    def test_keep_alive_serves_several_requests_on_one_connection(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        for stream in (True, False, True):
            conn.request("POST", "/v1/chat/completions",
                         body=json.dumps(chat_body(max_tokens=3, stream=stream)),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            resp.read()
        conn.request("GET", "/health")
        self.assertEqual(conn.getresponse().status, 200)
        conn.close()


class HttpErrorsTest(HttpTestCase):
    """Every error case, with curl: the status and an OpenAI error object naming the field."""

    server_args = ("--max-message-bytes", "2000000", "--max-tokens", "64")

    def chat(self, body: dict | str, *args: str) -> tuple[int, dict]:
        data = body if isinstance(body, str) else json.dumps(body)
        return curl(self.port, "/v1/chat/completions", *args, data=data)

    def test_bad_fields_are_400_naming_the_field(self):
        text = [{"role": "user", "content": "Hi"}]
        cases = [
            ({"messages": text, "n": 2}, "n"),
            ({"messages": text, "logprobs": True}, "logprobs"),
            ({"messages": text, "top_logprobs": 2}, "top_logprobs"),
            ({"messages": text, "max_tokens": 65}, "max_tokens"),
            ({"messages": text, "max_tokens": 0}, "max_tokens"),
            ({"messages": text, "temperature": "hot"}, "temperature"),
            ({"messages": text, "temperature": -1}, "temperature"),
            ({"messages": text, "top_p": 0}, "top_p"),
            ({"messages": text, "stop": 3}, "stop"),
            ({"messages": text, "min_tokens": 20}, "min_tokens"),  # over max_tokens (default 16)
            ({"messages": text, "min_tokens": -1}, "min_tokens"),
            ({"messages": text, "tools": [{"type": "function"}]}, "tools"),
            ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role"),
            ({"messages": []}, "messages"),
            ({"messages": "Hi"}, "messages"),
            ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages[0].content[0].type"),
            ({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}]},
             "messages[0].content[0].image_url.url"),
            ({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]},
             "messages[0].content[0].image_url.url"),
            ({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]},
             "messages[0].content[0].image_url.url"),
            ({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]},
             "messages[0].content[0].image_url"),  # decodes, but is no image
        ]
        for body, param in cases:
            with self.subTest(param=param, body=json.dumps(body)[:80]):
                status, error = self.chat(body)
                self.assertError(status, error, 400, param=param)

    def test_http_url_message_is_clear(self):
        status, error = self.chat({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]})
        self.assertError(status, error, 400, message="data URL")

    def test_malformed_json_is_400(self):
        status, error = self.chat('{"messages": [')
        self.assertError(status, error, 400, message="JSON")

    def test_unknown_model_is_404(self):
        status, error = self.chat({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
        self.assertError(status, error, 404, param="model")

    def test_unknown_path_is_404_and_wrong_method_405(self):
        status, error = curl(self.port, "/v1/embeddings", data="{}")
        self.assertError(status, error, 404)
        status, error = curl(self.port, "/v1/chat/completions")
        self.assertError(status, error, 405)

    def test_body_over_max_message_bytes_is_413(self):
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 2_100_000}]})
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write(big)
            f.flush()
            status, error = curl(self.port, "/v1/chat/completions", "-H", "Content-Type: application/json",
                                 "--data-binary", "@" + f.name)
        self.assertError(status, error, 413, message="max_message_bytes")
        # The server goes on.
        self.assertEqual(curl(self.port, "/health")[0], 200)


class HttpSlowClientTest(HttpTestCase):
    """Request-size and header limits, and the read timeout that drops a slow client."""

    server_args = ("--http-read-timeout-s", "1", "--http-idle-timeout-s", "2")

    def raw(self, data: bytes, wait: float) -> tuple[bytes, float]:
        """Sends `data`, then reads until the server closes (or `wait` s): (reply, seconds)."""
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait) as s:
            s.sendall(data)
            reply = b""
            try:
                while True:
                    piece = s.recv(65536)
                    if not piece:
                        break
                    reply += piece
            except socket.timeout:
                reply += b"<still open>"
        return reply, time.monotonic() - t0

    def test_half_sent_header_is_dropped_after_the_read_timeout(self):
        reply, took = self.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", wait=10)
        self.assertEqual(reply, b"")  # closed, nothing answered
        self.assertLess(took, 5)
        self.assertGreater(took, 0.8)

    def test_body_slower_than_the_read_timeout_is_dropped(self):
        reply, took = self.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                               wait=10)
        self.assertNotIn(b"<still open>", reply)
        self.assertLess(took, 5)

    def test_idle_keep_alive_connection_is_closed(self):
        reply, took = self.raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", wait=10)
        self.assertTrue(reply.startswith(b"HTTP/1.1 200"), reply)
        self.assertGreater(took, 1.5)
        self.assertLess(took, 6)

    def test_oversized_headers_are_431(self):
        reply, _ = self.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", wait=10)
        self.assertTrue(reply.startswith(b"HTTP/1.1 431"), reply[:200])
        error = json.loads(reply.split(b"\r\n\r\n", 1)[1])
        self.assertIn("headers", error["error"]["message"])

    def test_expect_100_continue(self):
        body = json.dumps({"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 2}).encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            self.assertTrue(s.recv(100).startswith(b"HTTP/1.1 100 Continue"))
            s.sendall(body)
            self.assertTrue(s.recv(100).startswith(b"HTTP/1.1 200"))


class HttpTlsTest(HttpTestCase):
    tls_dir: tempfile.TemporaryDirectory

    @classmethod
    def setUpClass(cls) -> None:
        cls.tls_dir = tempfile.TemporaryDirectory()
        cls.cert, key = make_self_signed_cert(cls.tls_dir.name)
        cls.server_args = ("--tls-cert", cls.cert, "--tls-key", key)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls.tls_dir.cleanup()

    def https(self, path: str, *args: str, data: str | None = None) -> tuple[int, dict]:
        with tempfile.NamedTemporaryFile() as out:
            cmd = ["curl", "-s", "--cacert", self.cert, "-o", out.name, "-w", "%{http_code}", *args]
            if data is not None:
                cmd += ["-H", "Content-Type: application/json", "--data-binary", data]
            run = subprocess.run(cmd + [f"https://127.0.0.1:{self.port}{path}"], capture_output=True, text=True,
                                 timeout=60)
            return int(run.stdout or 0), {"raw": open(out.name).read()}

    def test_https_stream_and_plaintext_refused(self):
        self.assertEqual(self.https("/health")[0], 200)
        status, body = self.https("/v1/chat/completions", data=json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}))
        self.assertEqual(status, 200)
        self.assertTrue(body["raw"].rstrip().endswith("data: [DONE]"), body)
        self.assertEqual(curl(self.port, "/health")[0], 0)  # plaintext on the TLS port: no HTTP answer


class HttpAuthTest(HttpTestCase):
    token_dir: tempfile.TemporaryDirectory

    @classmethod
    def setUpClass(cls) -> None:
        cls.token_dir = tempfile.TemporaryDirectory()
        path = os.path.join(cls.token_dir.name, "token")
        with open(path, "w") as f:
            f.write("s3cret\n")
        cls.server_args = ("--auth-token-file", path)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls.token_dir.cleanup()

    def test_token_required_on_the_api_not_on_health_and_metrics(self):
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        self.assertError(*curl(self.port, "/v1/chat/completions", data=body), 401)
        self.assertError(*curl(self.port, "/v1/chat/completions", "-H", "Authorization: Bearer wrong",
                               data=body), 401)
        self.assertError(*curl(self.port, "/v1/models"), 401)
        status, reply = curl(self.port, "/v1/chat/completions", "-H", "Authorization: Bearer s3cret", data=body)
        self.assertEqual(status, 200, reply)
        self.assertEqual(curl(self.port, "/health")[0], 200)
        self.assertEqual(curl(self.port, "/metrics")[0], 200)


class HttpQueueTest(HttpTestCase):
    server_args = ("--max-queue", "1", "--max-num-seqs", "1")

    def test_queue_full_is_429(self):
        long = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3000,
                           "ignore_eos": True, "stream": True})
        procs = []
        try:
            for _ in range(2):  # one runs, one waits: the queue (1) is full
                procs.append(subprocess.Popen(
                    ["curl", "-s", "-N", "-o", "/dev/null", "-H", "Content-Type: application/json",
                     "--data-binary", long, f"http://127.0.0.1:{self.port}/v1/chat/completions"]))
                time.sleep(0.5)
            deadline = time.monotonic() + 20
            while True:
                text = curl(self.port, "/metrics")[1]["raw"]
                if metric(text, "iris:num_requests_waiting") >= 1 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            status, error = curl(self.port, "/v1/chat/completions", data=json.dumps(
                {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
            self.assertError(status, error, 429, message="max_queue")
        finally:
            for p in procs:
                p.kill()
                p.wait()


class HttpDrainTest(HttpTestCase):
    server_args = ("--grace-period-s", "20")

    def test_draining_health_503_and_new_requests_503(self):
        long = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1500,
                           "ignore_eos": True, "stream": True})
        run = subprocess.Popen(["curl", "-s", "-N", "-H", "Content-Type: application/json", "--data-binary", long,
                                f"http://127.0.0.1:{self.port}/v1/chat/completions"],
                               stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        self.server.signal(signal.SIGTERM)
        time.sleep(0.3)
        status, body = curl(self.port, "/health")
        self.assertEqual(status, 503, body)
        status, error = curl(self.port, "/v1/chat/completions",
                             data=json.dumps({"messages": [{"role": "user", "content": "Hi"}]}))
        self.assertError(status, error, 503)
        out, _ = run.communicate(timeout=60)
        self.assertTrue(out.rstrip().endswith("data: [DONE]"), out[-300:])  # the one in flight finished
        self.assertEqual(self.server.wait(30), 0)


class HttpMetricsTest(HttpTestCase):
    server_args = ("--enable-prefix-caching=false",)  # the second image comes from the encoder cache

    def test_promtool_accepts_metrics_and_counters_move(self):
        before = curl(self.port, "/metrics")[1]["raw"]
        request(self.port, "POST", "/v1/chat/completions", chat_body(max_tokens=4, ignore_eos=True))
        request(self.port, "POST", "/v1/chat/completions", chat_body(max_tokens=3, ignore_eos=True, stream=True))
        request(self.port, "POST", "/v1/chat/completions", {"messages": [], "max_tokens": 3})
        text = curl(self.port, "/metrics")[1]["raw"]
        self.assertEqual(metric(text, "iris:generation_tokens_total") - metric(before, "iris:generation_tokens_total"), 7)
        self.assertEqual(metric(text, 'iris:requests_total{status="OK",finish_reason="length"}'), 2)
        self.assertEqual(metric(text, 'iris:requests_total{status="INVALID_ARGUMENT",finish_reason="none"}'), 1)
        self.assertEqual(metric(text, "iris:time_to_first_token_seconds_count"), 2)
        self.assertEqual(metric(text, "iris:inter_token_latency_seconds_count"), 5)
        self.assertGreater(metric(text, "iris:engine_step_time_seconds_count"), 0)
        self.assertEqual(metric(text, "iris:encoder_cache_misses_total"), 1)
        self.assertEqual(metric(text, "iris:encoder_cache_hits_total"), 1)
        self.assertGreater(metric(text, "iris:encoder_forward_time_seconds_count"), 0)
        self.assertEqual(metric(text, "iris:encoder_time_per_image_seconds_count"), 1)  # the second was cached
        self.assertEqual(metric(text, "iris:kv_cache_blocks_used"), 0)
        promtool = shutil.which("promtool")
        if promtool is None:
            self.skipTest("promtool is not installed (Debian package prometheus): the format check is skipped")
        run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
        # promtool's linter objects to every ':' in a name; the iris: prefix is the issue's
        # (as vLLM's vllm: is). Any other problem, or a parse error (exit 1), fails.
        problems = [line for line in (run.stdout + run.stderr).splitlines()
                    if line.strip() and not line.endswith("metric names should not contain ':'")]
        self.assertIn(run.returncode, (0, 3), run.stdout + run.stderr)
        self.assertEqual(problems, [])

    def test_metrics_port_when_http_is_off(self):
        if SERVER_BIN is None:
            self.skipTest("IRIS_SERVER_BIN is not set")
        server = ServerProcess(SERVER_BIN, ["--model", tiny_model(), "--port", "0", "--metrics-port", "0",
                                            "--dtype", "f32"])
        try:
            self.assertIsNone(HTTP_RE.search(server.stderr()))
            port = int(METRICS_RE.search(server.stderr()).group(1))
            with Client(server.target, timeout=60) as client:
                client.generate(text="Hi", max_tokens=3, ignore_eos=True)
            status, _, payload = request(port, "GET", "/metrics")
            self.assertEqual(status, 200)
            self.assertEqual(metric(payload.decode(), "iris:generation_tokens_total"), 3)
            self.assertEqual(request(port, "POST", "/v1/chat/completions", {})[0], 404)  # metrics only
        finally:
            server.stop()


class HttpConcurrencyTest(HttpTestCase):
    server_args = ("--max-num-seqs", "64")
    STREAMS = 200
    LEAVERS = 20
    MAX_TOKENS = 24

    async def one_stream(self, i: int, leave: bool) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        body = json.dumps({"messages": [{"role": "user", "content": f"Stream {i}"}], "stream": True,
                           "max_tokens": self.MAX_TOKENS, "ignore_eos": True}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        data = b""
        try:
            while b"data: [DONE]" not in data:
                piece = await asyncio.wait_for(reader.read(65536), 120)
                if not piece:
                    return "closed early"
                data += piece
                if leave and data.count(b'"content"') >= 3:  # mid-stream: a few tokens in
                    writer.transport.abort()  # RST, as a killed client
                    return "left"
        finally:
            writer.close()
        contents = re.findall(rb'"content":"([^"]*)"', data)
        finishes = re.findall(rb'"finish_reason":"(\w+)"', data)
        if finishes != [b"length"]:
            return f"finish {finishes}"
        return f"ok {len([c for c in contents if c])}"

    def test_200_streams_20_leave_rest_complete_and_kv_blocks_free(self):
        def rss_kib() -> int:
            with open(f"/proc/{self.server.proc.pid}/status") as f:
                return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

        async def run_all():
            return await asyncio.gather(*(self.one_stream(i, i % 10 == 0) for i in range(self.STREAMS)))

        asyncio.run(self.warm_up())
        idle_rss = rss_kib()
        results = asyncio.run(run_all())
        leavers = [r for i, r in enumerate(results) if i % 10 == 0]
        stayers = [r for i, r in enumerate(results) if i % 10 != 0]
        self.assertEqual(leavers, ["left"] * self.LEAVERS)
        self.assertEqual(stayers, [f"ok {self.MAX_TOKENS}"] * (self.STREAMS - self.LEAVERS))
        deadline = time.monotonic() + 30
        while True:
            text = curl(self.port, "/metrics")[1]["raw"]
            done = (metric(text, "iris:kv_cache_blocks_used") == 0 and metric(text, "iris:num_requests_running") == 0
                    and metric(text, "iris:num_requests_in_flight") == 0)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertTrue(done, text)
        self.assertEqual(metric(text, 'iris:requests_total{status="CANCELLED",finish_reason="cancelled"}'),
                         self.LEAVERS)
        self.assertEqual(metric(text, 'iris:requests_total{status="OK",finish_reason="length"}'),
                         self.STREAMS - self.LEAVERS + 64)
        # Memory back near idle: what 200 connections and their requests took is given back
        # (slack for allocator caches and the KV pages the new prompts touched).
        time.sleep(1.0)
        grown_mib = (rss_kib() - idle_rss) / 1024
        print(f"server RSS: idle {idle_rss / 1024:.1f} MiB, after the streams +{grown_mib:.1f} MiB", file=sys.stderr)
        self.assertLess(grown_mib, 16)

    async def warm_up(self):
        # A full batch first, so the idle level includes the engine's workspaces at batch size
        # max_num_seqs (the logits alone are 64 x vocab floats, 39 MiB).
        results = await asyncio.gather(*(self.one_stream(-1 - i, False) for i in range(64)))
        self.assertEqual(results, [f"ok {self.MAX_TOKENS}"] * 64)


if __name__ == "__main__":
    unittest.main()
