"""iris-bench --backend grpc against a fake Iris servicer built from the generated stubs."""

import json
import os
import subprocess
import tempfile
import unittest

from fakes import FakeIrisServer, IRIS_BENCH, NoThreadLeak, bench_env
from test_openai_backend import REPORT_LABELS, report_values


def run_bench(args, env=None, timeout=120):
    return subprocess.run([IRIS_BENCH] + args, env=env or bench_env(), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


class GrpcFakeTest(NoThreadLeak, unittest.TestCase):
    def test_throughput_mode(self):
        n, out_len = 12, 5
        with tempfile.TemporaryDirectory() as tmp, FakeIrisServer(token_gap_s=0.005) as srv:
            result = os.path.join(tmp, "r.json")
            r = run_bench(["--target", srv.target, "--num-prompts", str(n), "--output-len", str(out_len),
                           "--max-concurrency", "4", "--no-progress", "--save-result", result,
                           "--image-max-pixels", "100352", "--percentiles", "50,99"])
            self.assertEqual(r.returncode, 0, r.stderr)
            values = report_values(r.stdout)
            for label in REPORT_LABELS + ["Maximum request concurrency:", "P50 TTFT (ms):"]:
                self.assertIn(label, values, r.stdout)
            self.assertEqual(values["Successful requests:"], str(n))
            self.assertEqual(values["Total generated tokens:"], str(n * out_len))
            # usage from the final message: 20 + words of the question + 100 image tokens
            self.assertLessEqual(float(values["Peak concurrent requests:"]), 4)
            self.assertGreater(float(values["Mean ITL (ms):"]), 4.0)
            self.assertEqual(len(srv.requests), n + 1)  # + 1 warmup
            ids = [q.request_id for q in srv.requests]
            self.assertEqual(len(set(ids)), len(ids))
            for q in srv.requests:
                self.assertEqual(q.sampling.max_tokens, out_len)
                self.assertTrue(q.sampling.ignore_eos)
                self.assertEqual(q.sampling.temperature, 0.0)
                parts = q.messages[0].content
                self.assertEqual(q.messages[0].role, "user")
                self.assertEqual([p.WhichOneof("kind") for p in parts], ["image", "text"])
                self.assertEqual(parts[0].image.max_pixels, 100352)
            with open(result) as f:
                saved = json.load(f)
            self.assertEqual(saved["summary"]["completed"], n)
            text_tokens = 0
            for rec in saved["requests"]:
                self.assertTrue(rec["success"], rec)
                self.assertEqual(rec["image_tokens"], 100)
                self.assertEqual(rec["output_tokens"], out_len)
                self.assertEqual(rec["finish_reason"], "FINISH_REASON_LENGTH")
                self.assertEqual(len(rec["itl_s"]), out_len - 1)
                self.assertAlmostEqual(rec["e2el_s"], rec["ttft_s"] + sum(rec["itl_s"]), places=6)
                text_tokens += rec["prompt_tokens"] - rec["image_tokens"]
            self.assertEqual(int(values["Total input tokens:"]), text_tokens + 100 * n)

            # --text-only-input-tokens leaves the image tokens out
            r = run_bench(["--target", srv.target, "--num-prompts", str(n), "--output-len", str(out_len),
                           "--no-progress", "--text-only-input-tokens"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(int(report_values(r.stdout)["Total input tokens:"]), text_tokens)

    def test_sampling_flags_reach_every_request(self):
        with FakeIrisServer(token_gap_s=0.001) as srv:
            r = run_bench(["--target", srv.target, "--num-prompts", "3", "--output-len", "2", "--no-progress",
                           "--temperature", "0.7", "--top-p", "0.9", "--top-k", "40"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(len(srv.requests), 4)
            for q in srv.requests:
                self.assertAlmostEqual(q.sampling.temperature, 0.7, places=6)
                self.assertAlmostEqual(q.sampling.top_p, 0.9, places=6)
                self.assertEqual(q.sampling.top_k, 40)
                self.assertTrue(q.sampling.ignore_eos)
            # off by default: no top_p / top_k field sent at all
            srv.requests.clear()
            r = run_bench(["--target", srv.target, "--num-prompts", "1", "--output-len", "2", "--no-progress"])
            self.assertEqual(r.returncode, 0, r.stderr)
            for q in srv.requests:
                self.assertFalse(q.sampling.HasField("top_p"))
                self.assertFalse(q.sampling.HasField("top_k"))
        for bad in (["--top-p", "0"], ["--top-p", "1.5"], ["--temperature", "-1"], ["--top-k", "-2"]):
            r = run_bench(["--target", "127.0.0.1:1", "--num-prompts", "1"] + bad)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn(bad[0], r.stderr)

    def test_failures_are_counted_and_summarised(self):
        with FakeIrisServer(token_gap_s=0.0, fail_every=3) as srv:
            r = run_bench(["--target", srv.target, "--num-prompts", "9", "--output-len", "3",
                           "--mode", "latency", "--request-rate", "100", "--warmup", "0", "--no-progress"])
            self.assertEqual(r.returncode, 0, r.stderr)
            values = report_values(r.stdout)
            self.assertEqual((values["Successful requests:"], values["Failed requests:"]), ("6", "3"))
            self.assertEqual(values["Total generated tokens:"], "18")
            self.assertTrue(r.stdout.endswith("Errors (3 of 9 requests failed):\n"
                                              "  3 x RESOURCE_EXHAUSTED: queue full (fake)\n"), r.stdout)

    def test_jsonl_dataset(self):
        from PIL import Image
        with tempfile.TemporaryDirectory() as tmp, FakeIrisServer(token_gap_s=0.0) as srv:
            Image.new("RGB", (32, 24), (200, 10, 10)).save(os.path.join(tmp, "red.png"))
            path = os.path.join(tmp, "d.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"image": "red.png", "prompt": "What colour?", "output_len": 3}) + "\n")
                f.write(json.dumps({"image": None, "prompt": "Say hi.", "output_len": 2}) + "\n")
            r = run_bench(["--target", srv.target, "--dataset", "jsonl", "--dataset-path", path,
                           "--no-progress", "--warmup", "2"])
            self.assertEqual(r.returncode, 0, r.stderr)
            values = report_values(r.stdout)
            self.assertEqual(values["Successful requests:"], "2")   # every line by default
            self.assertEqual(values["Total generated tokens:"], "5")
            warm = srv.requests[:2]
            # the measured requests run concurrently: they may reach the server in either order
            measured = {q.messages[0].content[-1].text: q for q in srv.requests[2:]}
            self.assertEqual(sorted(measured), ["Say hi.", "What colour?"])
            with open(os.path.join(tmp, "red.png"), "rb") as f:
                red_png = f.read()
            for q in warm:  # warmups: the first line's prompt, an image of their own
                self.assertEqual(q.messages[0].content[-1].text, "What colour?")
                self.assertNotEqual(q.messages[0].content[0].image.data, red_png)
            self.assertEqual(measured["What colour?"].messages[0].content[0].image.data, red_png)
            self.assertEqual([p.WhichOneof("kind") for p in measured["Say hi."].messages[0].content], ["text"])
            # a bad line stops the run before anything is sent, naming line and field
            with open(path, "a") as f:
                f.write(json.dumps({"prompt": "x", "output_len": -1}) + "\n")
            r = run_bench(["--target", srv.target, "--dataset", "jsonl", "--dataset-path", path, "--no-progress"])
            self.assertEqual(r.returncode, 2)
            self.assertIn(f"{path}:3: field 'output_len' must be a positive integer", r.stderr)
            self.assertEqual(len(srv.requests), 4)

    def test_missing_stubs_and_bad_warmup(self):
        env = bench_env(IRIS_PYTHONPATH="/nonexistent/python")
        r = run_bench(["--target", "127.0.0.1:1", "--num-prompts", "1"], env=env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cmake --build build --target iris_python", r.stderr)
        self.assertIn("/nonexistent/python", r.stderr)
        # nothing listens on port 1: the warmup fails with UNAVAILABLE and nothing is reported
        r = run_bench(["--target", "127.0.0.1:1", "--num-prompts", "1", "--output-len", "2",
                       "--no-progress", "--timeout-s", "20"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("warmup request failed: UNAVAILABLE", r.stderr)
        self.assertEqual(r.stdout, "")


if __name__ == "__main__":
    unittest.main()
