"""iris-bench sweep against the fake servers: one table row and one JSON entry per level, each
level capped at its concurrency and sent its own images, PNG plots written, and bad
--concurrency lists refused naming the flag."""

import argparse
import json
import os
import subprocess
import tempfile
import unittest

from fakes import FakeIrisServer, FakeOpenAIServer, IRIS_BENCH, NoThreadLeak, bench_env
from iris_bench import sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_HEAD = ("| concurrency | success | req/s | output tok/s | mean TTFT (ms) | P99 TTFT (ms) "
              "| mean TPOT (ms) | P99 TPOT (ms) | P99 ITL (ms) |")


def run_bench(args, timeout=180):
    return subprocess.run([IRIS_BENCH] + args, env=bench_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def table_rows(stdout):
    rows = [l for l in stdout.splitlines() if l.startswith("| ")]
    return rows[0], [[c.strip() for c in l.strip("|").split("|")] for l in rows[1:]]


class ConcurrencyListTest(unittest.TestCase):
    def test_parses(self):
        self.assertEqual(sweep.parse_concurrency_list("1,2,4,8"), [1, 2, 4, 8])
        self.assertEqual(sweep.parse_concurrency_list(" 3 , 5 "), [3, 5])
        self.assertEqual(sweep.parse_concurrency_list("16"), [16])

    def test_refuses(self):
        for bad, why in (("", "comma-separated"), ("1,,2", "comma-separated"), ("1,", "comma-separated"),
                         ("a", "not an integer"), ("1.5", "not an integer"), ("0,1", "at least 1"),
                         ("-2", "at least 1"), ("4,2", "strictly increasing"), ("2,2", "strictly increasing")):
            with self.assertRaises(argparse.ArgumentTypeError, msg=bad) as cm:
                sweep.parse_concurrency_list(bad)
            self.assertIn(why, str(cm.exception), bad)


class SweepGrpcTest(NoThreadLeak, unittest.TestCase):
    def test_levels_json_and_plots(self):
        levels, n, out_len = [1, 2, 4], 6, 4
        with tempfile.TemporaryDirectory() as tmp, FakeIrisServer(token_gap_s=0.004) as srv:
            result, plots = os.path.join(tmp, "sweep.json"), os.path.join(tmp, "plots")
            r = run_bench(["sweep", "--target", srv.target, "--concurrency", "1,2,4", "--num-prompts", str(n),
                           "--output-len", str(out_len), "--no-progress", "--result-json", result,
                           "--plot-dir", plots])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            head, rows = table_rows(r.stdout)
            self.assertEqual(head, TABLE_HEAD)
            self.assertEqual([row[0] for row in rows], ["1", "2", "4"], r.stdout)
            for row in rows:
                self.assertEqual(row[1], "100.0%")
                self.assertGreater(float(row[3]), 0)
            with open(result) as f:
                saved = json.load(f)
            self.assertEqual(saved["config"]["mode"], "sweep")
            self.assertEqual(saved["config"]["concurrency"], levels)
            self.assertEqual([x["max_concurrency"] for x in saved["levels"]], levels)
            for x, row in zip(saved["levels"], rows):
                s = x["summary"]
                self.assertEqual((s["completed"], s["failed"], x["success_rate"]), (n, 0, 1.0))
                self.assertEqual(s["total_output_tokens"], n * out_len)
                self.assertLessEqual(s["max_concurrent_requests"], x["max_concurrency"])
                for key in ("p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p90_itl_ms",
                            "p99_itl_ms", "mean_tpot_ms", "p99_tpot_ms"):
                    self.assertGreater(s[key], 0, key)
                # the row prints the JSON's numbers
                self.assertEqual(row[2], f"{s['request_throughput']:.2f}")
                self.assertEqual(row[5], f"{s['p99_ttft_ms']:.2f}")
                self.assertEqual(row[8], f"{s['p99_itl_ms']:.2f}")
                self.assertGreater(s["mean_itl_ms"], 3.0)  # the fake's 4 ms gaps
            # with one request at a time, nothing overlaps
            self.assertEqual(saved["levels"][0]["summary"]["max_concurrent_requests"], 1)
            # 1 warmup + n per level, every one with its own image
            self.assertEqual(len(srv.requests), 1 + n * len(levels))
            images = [q.messages[0].content[0].image.data for q in srv.requests]
            self.assertEqual(len(set(images)), len(images))
            ids = [q.request_id for q in srv.requests]
            self.assertEqual(len(set(ids)), len(ids))
            names = sorted(os.listdir(plots))
            self.assertEqual(names, ["itl.png", "throughput.png", "ttft.png"])
            from PIL import Image
            for name in names:
                path = os.path.join(plots, name)
                with open(path, "rb") as f:
                    self.assertEqual(f.read(8), PNG_MAGIC, name)
                self.assertGreater(os.path.getsize(path), 5000, name)
                with Image.open(path) as im:
                    self.assertGreater(im.size[0], 300)
                    self.assertGreater(len(im.getcolors(1 << 16) or range(1 << 16)), 10)  # not blank

    def test_bad_concurrency_refused_naming_the_flag(self):
        for value in ("0", "4,2", "x", "1,,2"):
            r = run_bench(["sweep", "--target", "127.0.0.1:1", "--concurrency", value])
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("argument --concurrency:", r.stderr, value)
        for args, message in (
                (["sweep"], "--mode sweep needs --concurrency"),
                (["--concurrency", "1,2"], "--concurrency is for --mode sweep"),
                (["sweep", "--concurrency", "1", "--max-concurrency", "2"], "--max-concurrency is not for --mode sweep"),
                (["sweep", "--concurrency", "1", "--request-rate", "2"], "--request-rate is not for --mode sweep"),
                (["--plot-dir", "p"], "--plot-dir is for --mode sweep"),
                (["sweep", "--mode", "latency", "--concurrency", "1"], "runs --mode sweep, not --mode latency")):
            r = run_bench(["--target", "127.0.0.1:1"] + args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(message, r.stderr, args)

    def test_failed_requests_lower_the_success_rate(self):
        with tempfile.TemporaryDirectory() as tmp, FakeIrisServer(token_gap_s=0.001, fail_every=4) as srv:
            result = os.path.join(tmp, "sweep.json")
            r = run_bench(["--mode", "sweep", "--target", srv.target, "--concurrency", "1,2", "--num-prompts", "4",
                           "--output-len", "2", "--warmup", "0", "--no-progress", "--save-result", result])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            _, rows = table_rows(r.stdout)
            self.assertEqual([row[1] for row in rows], ["75.0%", "75.0%"])  # requests 4 and 8 fail
            self.assertIn("Errors at concurrency 1: 1 x RESOURCE_EXHAUSTED: queue full (fake)", r.stderr)
            with open(result) as f:
                saved = json.load(f)
            self.assertEqual([x["errors"] for x in saved["levels"]],
                             [[{"error": "RESOURCE_EXHAUSTED: queue full (fake)", "count": 1}]] * 2)


class SweepCompareTest(unittest.TestCase):
    """sweep-compare: several saved sweeps on one set of axes; bad inputs refused naming them."""

    @staticmethod
    def saved(levels):
        return {"config": {}, "levels": [
            {"max_concurrency": c, "requests": 4, "success_rate": 1.0, "errors": {},
             "summary": {"output_throughput": tok, "mean_ttft_ms": 100.0 * c, "p99_ttft_ms": 150.0 * c,
                         "p50_itl_ms": 30.0, "p99_itl_ms": itl}} for c, tok, itl in levels]}

    def test_plots_and_refusals(self):
        compare = os.path.join(os.path.dirname(IRIS_BENCH), "sweep-compare")
        with tempfile.TemporaryDirectory() as tmp:
            a, b = os.path.join(tmp, "a.json"), os.path.join(tmp, "b.json")
            with open(a, "w") as f:
                json.dump(self.saved([(1, 10.0, 40.0), (2, 18.0, 60.0)]), f)
            with open(b, "w") as f:
                json.dump(self.saved([(1, 11.0, 900.0), (2, 19.0, 4000.0), (4, 20.0, 5000.0)]), f)
            out = os.path.join(tmp, "plots")
            r = subprocess.run([compare, f"on={a}", f"off={b}", "--plot-dir", out], capture_output=True,
                               text=True, timeout=120, env=bench_env())
            self.assertEqual(r.returncode, 0, r.stderr)
            names = sorted(os.listdir(out))
            self.assertEqual(names, ["compare_itl.png", "compare_throughput.png", "compare_ttft.png"])
            for name in names:
                with open(os.path.join(out, name), "rb") as f:
                    self.assertEqual(f.read(8), PNG_MAGIC, name)
                self.assertGreater(os.path.getsize(os.path.join(out, name)), 5000, name)
            r = subprocess.run([compare, a, "--plot-dir", out], capture_output=True, text=True, timeout=60,
                               env=bench_env())
            self.assertEqual(r.returncode, 2)
            self.assertIn("expected LABEL=FILE.json", r.stderr)
            with open(a, "w") as f:
                json.dump({"levels": []}, f)
            r = subprocess.run([compare, f"x={a}", "--plot-dir", out], capture_output=True, text=True, timeout=60,
                               env=bench_env())
            self.assertEqual(r.returncode, 2)
            self.assertIn("is not a sweep result", r.stderr)


class SweepOpenAITest(NoThreadLeak, unittest.TestCase):
    def test_openai_levels(self):
        with FakeOpenAIServer(chunk_gap_s=0.002) as srv:
            r = run_bench(["sweep", "--backend", "openai-chat", "--target", srv.target, "--concurrency", "2,3",
                           "--num-prompts", "3", "--output-len", "3", "--no-progress"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            _, rows = table_rows(r.stdout)
            self.assertEqual([(row[0], row[1]) for row in rows], [("2", "100.0%"), ("3", "100.0%")])
            self.assertEqual(len(srv.requests), 1 + 3 * 2)


if __name__ == "__main__":
    unittest.main()
