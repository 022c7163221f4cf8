"""Two iris-server replicas behind HAProxy (Debian's haproxy; HTTP and gRPC frontends, active
health checks on GET /health), iris-bench through the proxy over both fronts at once, and one
replica killed with SIGKILL mid-run: the runs end (nothing hangs), requests on the dead replica
fail and are counted (502 / UNAVAILABLE or a reset stream), the rest succeed, and afterwards the
proxy sends everything to the live replica. Loopback only, bounded by timeouts.

Needs IRIS_SERVER_BIN, IRIS_TEST_MODELS (model_tiny), haproxy (skipped without it).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python_client"))

from fakes import IRIS_BENCH, bench_env  # noqa: E402
from iris_test_util import ServerProcess  # noqa: E402

SERVER_BIN = os.environ.get("IRIS_SERVER_BIN") or None
MODELS = os.environ.get("IRIS_TEST_MODELS") or None
HTTP_PORT_PREFIX = "iris-server: HTTP listening on "
GRPC_ERROR = ("HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: 14\r\n"
              "grpc-message: no iris replica could take the call (proxy)\r\ncontent-length: 0\r\n\r\n")

HAPROXY_CFG = """
global
    maxconn 2000
defaults
    mode http
    timeout connect 1s
    timeout client 120s
    timeout server 120s
    retries 2
    option redispatch 1
frontend http_in
    bind 127.0.0.1:{http_front}
    default_backend iris_http
frontend grpc_in
    bind 127.0.0.1:{grpc_front} proto h2
    default_backend iris_grpc
backend iris_http
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    server r1 127.0.0.1:{h1} check inter 200ms fall 2 rise 2
    server r2 127.0.0.1:{h2} check inter 200ms fall 2 rise 2
backend iris_grpc
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    # HAProxy's own errors as gRPC statuses (UNAVAILABLE), not HTML pages.
    errorfile 502 {grpc_error}
    errorfile 503 {grpc_error}
    errorfile 504 {grpc_error}
    server r1 127.0.0.1:{g1} proto h2 check port {h1} check-proto h1 inter 200ms fall 2 rise 2
    server r2 127.0.0.1:{g2} proto h2 check port {h2} check-proto h1 inter 200ms fall 2 rise 2
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def http_port(server: ServerProcess) -> int:
    for line in server.stderr().splitlines():
        if line.startswith(HTTP_PORT_PREFIX):
            return int(line.rsplit(":", 1)[1])
    raise AssertionError(server.stderr())


class LoadBalancerTest(unittest.TestCase):
    N = 30  # requests per run, of 800 tokens (seconds each on the tiny model: a wide window for the kill)

    def setUp(self) -> None:
        if SERVER_BIN is None or MODELS is None:
            self.skipTest("IRIS_SERVER_BIN is not set")
        self.haproxy = shutil.which("haproxy")
        if self.haproxy is None:
            self.skipTest("haproxy is not installed (Debian package haproxy): the load-balancer test is skipped")
        self.tmp = tempfile.TemporaryDirectory()
        self.replicas = [ServerProcess(SERVER_BIN, ["--model", os.path.join(MODELS, "tiny"), "--port", "0",
                                                    "--http-port", "0", "--dtype", "f32"])
                         for _ in range(2)]
        self.http_front, self.grpc_front = free_port(), free_port()
        cfg = os.path.join(self.tmp.name, "haproxy.cfg")
        grpc_error = os.path.join(self.tmp.name, "grpc-unavailable.http")
        with open(grpc_error, "w") as f:
            f.write(GRPC_ERROR)
        with open(cfg, "w") as f:
            f.write(HAPROXY_CFG.format(grpc_error=grpc_error, http_front=self.http_front, grpc_front=self.grpc_front,
                                       h1=http_port(self.replicas[0]), h2=http_port(self.replicas[1]),
                                       g1=self.replicas[0].port, g2=self.replicas[1].port))
        check = subprocess.run([self.haproxy, "-c", "-f", cfg], capture_output=True, text=True, timeout=30)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.proxy = subprocess.Popen([self.haproxy, "-db", "-f", cfg], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
        wait_port(self.http_front)
        wait_port(self.grpc_front)
        time.sleep(1.0)  # both replicas seen healthy (rise 2 x 200 ms)

    def tearDown(self) -> None:
        if hasattr(self, "proxy"):
            self.proxy.kill()
            self.proxy.wait(10)
        for r in getattr(self, "replicas", []):
            r.kill()
        if hasattr(self, "tmp"):
            self.tmp.cleanup()

    @staticmethod
    def victim_metric(victim: ServerProcess, name: str) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", http_port(victim), timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return -1

    def bench(self, backend: str, target: str, result: str) -> subprocess.Popen:
        # Text-only prompts: each call gets its first token (and, over HTTP, its response head)
        # within milliseconds, so the calls the kill catches are mid-stream. (A call killed before
        # its head is sent is retried by iris-bench's HTTP client, which retries once when a
        # kept-alive connection closes before any answer: it then succeeds on the other replica.)
        dataset = os.path.join(self.tmp.name, "text.jsonl")
        with open(dataset, "w") as f:
            for i in range(self.N):
                f.write(json.dumps({"image": None, "prompt": f"Request {i}: tell a long story.",
                                    "output_len": 800}) + "\n")
        return subprocess.Popen(
            [IRIS_BENCH, "--backend", backend, "--target", target, "--num-prompts", str(self.N),
             "--dataset", "jsonl", "--dataset-path", dataset, "--max-concurrency", "6", "--warmup", "0", "--no-progress",
             "--timeout-s", "60", "--request-id-prefix", backend, "--save-result", result],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=bench_env())

    def test_sigkill_one_replica_mid_run(self):
        results = {b: os.path.join(self.tmp.name, f"{b}.json") for b in ("openai-chat", "grpc")}
        runs = {"openai-chat": self.bench("openai-chat", f"127.0.0.1:{self.http_front}", results["openai-chat"]),
                "grpc": self.bench("grpc", f"127.0.0.1:{self.grpc_front}", results["grpc"])}
        # Kill once the victim has finished some requests of both runs and has calls of both in
        # flight (its own gauges).
        victim = self.replicas[0]
        deadline = time.monotonic() + 120
        while True:
            log = victim.stderr()
            total = self.victim_metric(victim, "iris:num_requests_in_flight")
            http_calls = self.victim_metric(victim, "iris:num_requests_in_flight_http")
            ready = all(f"id={b}" in log for b in runs) and http_calls >= 2 and total - http_calls >= 2
            if ready or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.assertTrue(ready, f"the victim never had calls of both runs in flight ({http_calls} HTTP of {total})")
        self.assertIsNone(victim.proc.poll(), "the replica died before the kill")
        victim.proc.send_signal(signal.SIGKILL)
        outputs = {}
        for backend, run in runs.items():
            try:
                outputs[backend], _ = run.communicate(timeout=240)  # nothing hangs
            except subprocess.TimeoutExpired:
                run.kill()
                self.fail(f"iris-bench {backend} through the proxy did not finish: {run.communicate()[0][-3000:]}")
            self.assertEqual(run.returncode, 0, outputs[backend][-3000:])
        for backend, path in results.items():
            with open(path) as f:
                saved = json.load(f)
            summary = saved["summary"]
            report = (f"{backend}: {summary['completed']} ok, {summary['failed']} failed: "
                      f"{saved['errors']}")
            print(report, file=sys.stderr)
            self.assertEqual(summary["completed"] + summary["failed"], self.N, report)
            # The killed replica had requests in flight (round robin, 6 at a time): they fail,
            # with a proxy error or a reset, and are counted; the others succeed.
            self.assertGreater(summary["failed"], 0, report)
            self.assertGreater(summary["completed"], self.N // 2, report)
            for e in saved["errors"]:
                self.assertRegex(e["error"], r"502|503|UNAVAILABLE|INTERNAL|Stream removed|reset|Incomplete|closed|EOF|Disconnected",
                                 report)
        # The proxy has marked the dead replica down: everything goes to the live one now.
        for _ in range(10):
            conn = http.client.HTTPConnection("127.0.0.1", self.http_front, timeout=30)
            conn.request("POST", "/v1/chat/completions", body=json.dumps(
                {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
                headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200, resp.read())
            resp.read()
            conn.close()
        self.assertIsNone(self.replicas[1].proc.poll())


if __name__ == "__main__":
    unittest.main()
