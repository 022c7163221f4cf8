"""iris-bench and ablation against a real iris-server on the tiny synthetic model.

Needs IRIS_SERVER_BIN (the iris-server binary) and the tiny model (ctest fixture model_tiny:
$IRIS_TEST_MODELS/tiny); skipped without the binary.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

from fakes import ABLATION, IRIS_BENCH, NoThreadLeak, ServesModel, bench_env, make_self_signed_cert
from test_openai_backend import REPORT_LABELS, report_values

SERVER_BIN = os.environ.get("IRIS_SERVER_BIN", "")
MODEL = os.path.join(os.environ.get("IRIS_TEST_MODELS", ""), "tiny")
N, OUT_LEN = 12, 16


def run(cmd, timeout=300):
    return subprocess.run(cmd, env=bench_env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@unittest.skipUnless(SERVER_BIN, "IRIS_SERVER_BIN is not set")
class IrisBenchE2ETest(ServesModel, NoThreadLeak, unittest.TestCase):
    MODEL_DIR, FIXTURE = MODEL, "model_tiny"

    def bench(self, *args):
        result = os.path.join(self.tmp.name, f"{self.id().rsplit('.', 1)[-1]}.json")
        r = run([IRIS_BENCH, "--target", self.server.target, "--num-prompts", str(N),
                 "--output-len", str(OUT_LEN), "--no-progress", "--save-result", result] + list(args))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.server.log()[-3000:])
        values = report_values(r.stdout)
        for label in REPORT_LABELS:
            self.assertIn(label, values, r.stdout)
        self.assertEqual(values["Successful requests:"], str(N), r.stdout)
        self.assertEqual(values["Failed requests:"], "0", r.stdout)
        self.assertEqual(values["Total generated tokens:"], str(N * OUT_LEN))
        self.assertTrue(r.stdout.endswith("=" * 50 + "\n"), r.stdout)
        with open(result) as f:
            saved = json.load(f)
        self.assertEqual(len(saved["requests"]), N)
        image_tokens = 0
        for rec in saved["requests"]:
            self.assertTrue(rec["success"], rec)
            self.assertEqual(rec["output_tokens"], OUT_LEN)
            self.assertEqual(rec["finish_reason"], "FINISH_REASON_LENGTH")
            self.assertGreater(rec["image_tokens"], 0)
            self.assertGreater(rec["prompt_tokens"], rec["image_tokens"])
            self.assertGreater(rec["ttft_s"], 0)
            self.assertEqual(rec["counted_tokens"], OUT_LEN)  # token ids streamed
            self.assertEqual(len(rec["itl_s"]), rec["chunks"] - 1)
            self.assertGreater(rec["server_timings_ms"]["total_ms"], 0)
            image_tokens += rec["image_tokens"]
        total_prompt = sum(rec["prompt_tokens"] for rec in saved["requests"])
        expected_input = total_prompt - image_tokens if "--text-only-input-tokens" in args else total_prompt
        self.assertEqual(int(values["Total input tokens:"]), expected_input)
        self.assertEqual(saved["summary"]["total_input_tokens"], expected_input)
        return values, saved, image_tokens

    def test_throughput_mode(self):
        values, saved, _ = self.bench("--mode", "throughput", "--max-concurrency", "4")
        self.assertEqual(values["Maximum request concurrency:"], "4")
        self.assertNotIn("Request rate configured (RPS):", values)
        self.assertLessEqual(float(values["Peak concurrent requests:"]), 4)
        self.assertEqual(saved["config"]["mode"], "throughput")

    def test_latency_mode(self):
        values, saved, image_tokens = self.bench(
            "--mode", "latency", "--request-rate", "8", "--burstiness", "5", "--seed", "5",
            "--image-max-pixels", "200704", "--text-only-input-tokens")
        self.assertEqual(values["Request rate configured (RPS):"], "8.00")
        self.assertNotIn("Maximum request concurrency:", values)
        # every image was resized within 200704 pixels: at most 256 tokens each
        for rec in saved["requests"]:
            self.assertLessEqual(rec["image_tokens"], 256)
        self.assertGreater(image_tokens, N * 16)

    def bench_unchecked(self, *args):
        return run([IRIS_BENCH, "--target", self.server.target, "--no-progress"] + list(args))

    def test_server_rejections_are_reported(self):
        # ask for more tokens than the server allows: every request fails with INVALID_ARGUMENT
        r = self.bench_unchecked("--num-prompts", "2", "--output-len", "1000000", "--warmup", "0")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)  # nothing succeeded
        values = report_values(r.stdout)
        self.assertEqual((values["Successful requests:"], values["Failed requests:"]), ("0", "2"))
        self.assertIn("Errors (2 of 2 requests failed):\n  2 x INVALID_ARGUMENT: ", r.stdout)


@unittest.skipUnless(SERVER_BIN, "IRIS_SERVER_BIN is not set")
class TlsTokenE2ETest(NoThreadLeak, unittest.TestCase):
    def test_tls_ca_and_token_file(self):
        from iris_bench.server_proc import IrisServer
        if not os.path.isfile(os.path.join(MODEL, "config.json")):
            self.skipTest(f"no tiny model at {MODEL}")
        if not shutil.which("openssl"):
            self.skipTest("no openssl to make a certificate")
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = make_self_signed_cert(tmp)
            tok = os.path.join(tmp, "token")
            with open(tok, "w") as f:
                f.write("bench-secret\n")
            args = [f"--model={MODEL}", f"--tls_cert={cert}", f"--tls_key={key}", f"--auth_token_file={tok}"]
            with IrisServer(SERVER_BIN, args, startup_timeout_s=120) as server:
                base = [IRIS_BENCH, "--target", server.target, "--num-prompts", "2", "--output-len", "4",
                        "--no-progress", "--tls-ca", cert]
                r = run(base + ["--token-file", tok])
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertEqual(report_values(r.stdout)["Successful requests:"], "2")
                r = run(base + ["--warmup", "0"])  # no token: every request is refused, and said so
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn("Errors (2 of 2 requests failed):\n  2 x UNAUTHENTICATED: ", r.stdout)
            self.assertEqual(server.returncode, 0)


@unittest.skipUnless(SERVER_BIN, "IRIS_SERVER_BIN is not set")
class AblationE2ETest(NoThreadLeak, unittest.TestCase):
    def test_two_configs(self):
        if not os.path.isfile(os.path.join(MODEL, "config.json")):
            self.skipTest(f"no tiny model at {MODEL}")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ablation.json")
            r = run([ABLATION, "--model", MODEL, "--server-bin", SERVER_BIN, "--num-prompts", "4",
                     "--output-len", "8", "--max-concurrency", "4", "--request-rate", "20",
                     "--configs", "all on,cached cu_seqlens off", "--out", out,
                     "--extra-server-args", "--workers=2", "--", "--max_pixels=200704"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("### Throughput mode (4 prompts, max concurrency 4)\n", r.stdout)
            self.assertIn("### Latency mode (4 prompts, request rate 20/s, burstiness 5)\n", r.stdout)
            rows = [l for l in r.stdout.splitlines() if l.startswith("| ")]
            self.assertEqual(len(rows), 2 * 4, r.stdout)  # header, rule and two configs per mode
            self.assertTrue(rows[0].startswith("| config | mean TTFT (ms) | median TTFT (ms) | P99 TTFT (ms) "
                                               "| mean TPOT (ms) | median TPOT (ms) | P99 TPOT (ms) "
                                               "| output throughput (tok/s) | failed |"), rows[0])
            off = [l for l in rows if l.startswith("| cached cu_seqlens off |")]
            self.assertEqual(len(off), 2)
            for line in off:
                self.assertRegex(line, r"\(\+|\(-")  # changes against "all on"
                self.assertTrue(line.endswith("| 0 |"), line)
            with open(out) as f:
                saved = json.load(f)
            self.assertEqual([(x["config"], x["mode"]) for x in saved["runs"]], [
                ("all on", "throughput"), ("all on", "latency"),
                ("cached cu_seqlens off", "throughput"), ("cached cu_seqlens off", "latency")])
            for x in saved["runs"]:
                techniques = x["server"]["encoder_techniques"]
                self.assertEqual(techniques["cached_cu_seqlens"], x["config"] == "all on")
                self.assertTrue(techniques["fused_rotary"])
                self.assertIn("--max_pixels=200704", x["server_flags"])
                self.assertIn("--workers=2", x["server_flags"])
                self.assertEqual(x["summary"]["completed"], 4)
                self.assertNotIn("requests", x["result"])


if __name__ == "__main__":
    unittest.main()
