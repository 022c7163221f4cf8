"""iris-bench --backend openai-chat against in-process fake OpenAI-compatible servers, and its
HTTP/1.1 + SSE pieces on their own."""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from fakes import FakeOpenAIServer, IRIS_BENCH, NoThreadLeak, bench_env, make_self_signed_cert
from iris_bench import datasets
from iris_bench.http_client import HttpClient, SseParser
from iris_bench.openai_backend import qwen2_5_vl_image_tokens, split_target

REPORT_LABELS = [
    "Successful requests:", "Failed requests:", "Benchmark duration (s):", "Total input tokens:",
    "Total generated tokens:", "Request throughput (req/s):", "Output token throughput (tok/s):",
    "Peak output token throughput (tok/s):", "Peak concurrent requests:",
    "Total token throughput (tok/s):", "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):",
    "Mean TPOT (ms):", "Median TPOT (ms):", "P99 TPOT (ms):", "Mean ITL (ms):",
    "Median ITL (ms):", "P99 ITL (ms):",
]


def report_values(stdout: str) -> dict:
    """label -> value text of the report lines (value at column 42)."""
    out = {}
    for line in stdout.splitlines():
        if len(line) > 41 and line[40] == " " and line[:40].rstrip().endswith(":"):
            out[line[:40].rstrip()] = line[41:]
    return out


def run_bench(args, timeout=120):
    return subprocess.run([IRIS_BENCH] + args, env=bench_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class SseParserTest(unittest.TestCase):
    def test_events_split_anywhere(self):
        stream = (b": comment\r\n\r\ndata: {\"a\": 1}\r\n\r\ndata:two\ndata: lines\n\n"
                  b"event: x\nid: 3\ndata: [DONE]\n\n")
        expected = ['{"a": 1}', "two\nlines", "[DONE]"]
        for step in (1, 2, 3, 7, len(stream)):
            p = SseParser()
            events = []
            for i in range(0, len(stream), step):
                events += p.feed(stream[i:i + step])
            events += p.finish()
            self.assertEqual(events, expected, step)

    def test_finish_flushes_an_unterminated_event(self):
        p = SseParser()
        self.assertEqual(p.feed(b"data: last"), [])
        self.assertEqual(p.finish(), ["last"])
        self.assertEqual(p.finish(), [])


class HelpersTest(unittest.TestCase):
    def test_split_target(self):
        self.assertEqual(split_target("127.0.0.1:8000"), ("127.0.0.1", 8000))
        self.assertEqual(split_target("[::1]:9"), ("::1", 9))
        with self.assertRaises(ValueError):
            split_target("localhost")

    def test_image_token_estimate(self):
        # 640x480 -> smart_resize 644x476 -> 23*17 = 391 tokens; 1920x1080 -> 1932x1092 -> 69*39
        self.assertEqual(qwen2_5_vl_image_tokens(640, 480), 23 * 17)
        self.assertEqual(qwen2_5_vl_image_tokens(1920, 1080), 69 * 39)
        self.assertEqual(qwen2_5_vl_image_tokens(20, 20), 4)  # min_pixels 3136: 56x56 -> 2x2


class HttpClientTest(NoThreadLeak, unittest.TestCase):
    def test_chunked_stream_and_keep_alive(self):
        with FakeOpenAIServer(chunk_gap_s=0.0) as srv:
            host, port = split_target(srv.target)

            async def go():
                client = HttpClient(host, port)
                try:
                    bodies = []
                    for _ in range(3):
                        body = json.dumps({"model": "m", "max_tokens": 2, "messages": [
                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}).encode()
                        resp, _ = await client.request("POST", "/v1/chat/completions", body,
                                                       {"Content-Type": "application/json"})
                        self.assertEqual(resp.status, 200)
                        bodies.append(await resp.read_body())
                        self.assertTrue(resp.complete)
                        await client.release(resp)
                    resp, _ = await client.request("GET", "/nope")
                    self.assertEqual(resp.status, 404)
                    self.assertIn(b"not found", await resp.read_body())
                    await client.release(resp)
                    return bodies, len(client._open)
                finally:
                    await client.close()
            bodies, open_conns = asyncio.run(go())
            self.assertEqual(open_conns, 1)  # one connection served all four requests
            self.assertEqual(len(srv.httpd.peers), 1)
            events = SseParser().feed(bodies[0])
            self.assertEqual(events[-1], "[DONE]")
            self.assertEqual(json.loads(events[-2])["usage"]["completion_tokens"], 2)


class OpenAIEndToEndTest(NoThreadLeak, unittest.TestCase):
    def test_benchmark_completes(self):
        n, out_len = 10, 6
        with tempfile.TemporaryDirectory() as tmp, FakeOpenAIServer(chunk_gap_s=0.01) as srv:
            result = os.path.join(tmp, "r.json")
            r = run_bench(["--backend", "openai-chat", "--target", srv.target, "--mode", "throughput",
                           "--num-prompts", str(n), "--max-concurrency", "3", "--output-len", str(out_len),
                           "--no-progress", "--seed", "1", "--save-result", result])
            self.assertEqual(r.returncode, 0, r.stderr)
            values = report_values(r.stdout)
            for label in REPORT_LABELS + ["Maximum request concurrency:"]:
                self.assertIn(label, values, r.stdout)
            self.assertNotIn("Request rate configured (RPS):", values)
            self.assertTrue(r.stdout.startswith("============ Serving Benchmark Result ============\n"))
            self.assertTrue(r.stdout.endswith("=" * 50 + "\n"), r.stdout)  # no error summary
            self.assertEqual(values["Successful requests:"], str(n))
            self.assertEqual(values["Failed requests:"], "0")
            self.assertEqual(values["Maximum request concurrency:"], "3")
            self.assertEqual(values["Total generated tokens:"], str(n * out_len))
            self.assertLessEqual(float(values["Peak concurrent requests:"]), 3)
            # the first (role-only) event is not a token: TTFT includes the first 10 ms gap
            self.assertGreater(float(values["Mean TTFT (ms):"]), 8.0)
            self.assertGreater(float(values["Mean ITL (ms):"]), 8.0)

            # requests as sent: 1 warmup + n, model from /v1/models, streaming with usage
            self.assertEqual(len(srv.requests), n + 1)
            prompts = {q.prompt for q in datasets.synthetic_dataset(n, 1, out_len)}
            for req in srv.requests:
                self.assertEqual(req["model"], "fake-vl")
                self.assertEqual(req["max_tokens"], out_len)
                self.assertEqual(req["max_completion_tokens"], out_len)
                self.assertIs(req["stream"], True)
                self.assertEqual(req["stream_options"], {"include_usage": True})
                self.assertIs(req["ignore_eos"], True)
                self.assertEqual(req["temperature"], 0.0)
                parts = req["messages"][0]["content"]
                self.assertEqual([p["type"] for p in parts], ["image_url", "text"])
            self.assertTrue({req["messages"][0]["content"][1]["text"] for req in srv.requests[1:]} <= prompts)
            self.assertLessEqual(len(srv.httpd.peers), 4)  # keep-alive: at most concurrency + 1

            with open(result) as f:
                saved = json.load(f)
            self.assertEqual(saved["summary"]["completed"], n)
            self.assertEqual(saved["config"]["backend"], "openai-chat")
            self.assertEqual(len(saved["requests"]), n)
            for rec in saved["requests"]:
                self.assertTrue(rec["success"])
                self.assertEqual(rec["output_tokens"], out_len)
                self.assertEqual(rec["chunks"], out_len)
                self.assertEqual(len(rec["itl_s"]), out_len - 1)
                self.assertGreater(rec["ttft_s"], 0.008)
                self.assertAlmostEqual(rec["e2el_s"], rec["ttft_s"] + sum(rec["itl_s"]), places=6)
                self.assertEqual(rec["image_tokens_source"], "estimated")
                self.assertEqual(rec["generated_text"], "".join(f"w{i} " for i in range(out_len)))

    def test_sampling_flags_reach_the_body(self):
        with FakeOpenAIServer(chunk_gap_s=0.001) as srv:
            r = run_bench(["--backend", "openai-chat", "--target", srv.target, "--num-prompts", "2",
                           "--output-len", "2", "--no-progress", "--temperature", "1", "--top-k", "50"])
            self.assertEqual(r.returncode, 0, r.stderr)
            for req in srv.requests:
                self.assertEqual(req["temperature"], 1.0)
                self.assertEqual(req["top_k"], 50)
                self.assertNotIn("top_p", req)
                self.assertEqual(next(iter(req)), "model")  # still the body's first key

    def test_latency_mode_and_failures(self):
        n, marker, seed = 24, "image", 2
        reqs = datasets.synthetic_dataset(n, seed, 4)
        n_fail = sum(marker in q.prompt for q in reqs)
        self.assertTrue(0 < n_fail < n, n_fail)  # the seed gives a mix
        with FakeOpenAIServer(chunk_gap_s=0.001, fail_marker=marker) as srv:
            r = run_bench(["--backend", "openai-chat", "--target", srv.target, "--model", "fake-vl",
                           "--mode", "latency", "--request-rate", "40", "--burstiness", "2",
                           "--num-prompts", str(n), "--output-len", "4", "--seed", str(seed),
                           "--warmup", "0", "--no-progress", "--text-only-input-tokens"])
            self.assertEqual(r.returncode, 0, r.stderr)
            values = report_values(r.stdout)
            for label in REPORT_LABELS + ["Request rate configured (RPS):"]:
                self.assertIn(label, values, r.stdout)
            self.assertNotIn("Maximum request concurrency:", values)
            self.assertEqual(values["Request rate configured (RPS):"], "40.00")
            self.assertEqual(values["Failed requests:"], str(n_fail))
            self.assertEqual(values["Successful requests:"], str(n - n_fail))
            self.assertEqual(values["Total generated tokens:"], str(4 * (n - n_fail)))
            tail = r.stdout.split("=" * 50 + "\n", 1)[1]
            self.assertEqual(tail, f"Errors ({n_fail} of {n} requests failed):\n"
                                   f"  {n_fail} x HTTP 500 Internal Server Error: fake failure\n")
            self.assertIn("estimates", r.stderr)
            self.assertEqual(len(srv.requests), n)

    def test_https_and_token(self):
        if not shutil.which("openssl"):
            self.skipTest("no openssl to make a certificate")
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = make_self_signed_cert(tmp)
            tok = os.path.join(tmp, "token")
            with open(tok, "w") as f:
                f.write("s3cret\n")
            with FakeOpenAIServer(chunk_gap_s=0.0, token="s3cret", tls_cert_key=(cert, key)) as srv:
                base = ["--backend", "openai-chat", "--target", srv.target, "--model", "m",
                        "--num-prompts", "3", "--output-len", "2", "--no-progress", "--tls-ca", cert]
                r = run_bench(base + ["--token-file", tok])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(report_values(r.stdout)["Successful requests:"], "3")
                r = run_bench(base + ["--warmup", "0"])
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("  3 x HTTP 401 Unauthorized: bad or missing token\n", r.stdout)

    def test_unreachable_server(self):
        with FakeOpenAIServer() as srv:
            target = srv.target
        # the port is closed now: the warmup fails and says so
        r = run_bench(["--backend", "openai-chat", "--target", target, "--model", "m",
                       "--num-prompts", "2", "--output-len", "2", "--no-progress"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("warmup request failed", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_usage_errors(self):
        r = run_bench(["--target", "127.0.0.1:1", "--mode", "latency"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--request-rate", r.stderr)
        r = run_bench(["--target", "127.0.0.1:1", "--request-rate", "3"])
        self.assertEqual(r.returncode, 2)
        r = run_bench(["--target", "127.0.0.1:1", "--dataset", "jsonl"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--dataset-path", r.stderr)


if __name__ == "__main__":
    unittest.main()
