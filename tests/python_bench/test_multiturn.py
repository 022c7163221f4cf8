"""The multi-turn dataset: each conversation's second turn resends turn 1's message (the same
image bytes) and the assistant's actual reply, then a new question; the report gives each
turn's TTFT; a failed first turn leaves its second unsent and counted as failed."""

import json
import os
import subprocess
import tempfile
import unittest

from fakes import FakeIrisServer, FakeOpenAIServer, IRIS_BENCH, NoThreadLeak, bench_env
from iris_bench import datasets
from test_openai_backend import report_values


def run_bench(args, timeout=180):
    return subprocess.run([IRIS_BENCH] + args, env=bench_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class MultiturnDatasetTest(unittest.TestCase):
    def test_turn_one_is_the_synthetic_request(self):
        conv = datasets.multiturn_dataset(6, seed=3, output_len=8, start=2)
        plain = datasets.synthetic_dataset(6, seed=3, output_len=8, start=2)
        for c, p in zip(conv, plain):
            self.assertEqual((c.image, c.prompt, c.output_len), (p.image, p.prompt, p.output_len))
            self.assertIn(c.follow_up, datasets.FOLLOW_UPS)
            self.assertIsNone(p.follow_up)
        again = datasets.multiturn_dataset(6, seed=3, output_len=8, start=2)
        self.assertEqual([c.follow_up for c in conv], [c.follow_up for c in again])
        many = datasets.multiturn_dataset(40, seed=3, output_len=8)
        self.assertGreater(len({c.follow_up for c in many}), 3)


class MultiturnGrpcTest(NoThreadLeak, unittest.TestCase):
    def test_second_turn_carries_image_and_reply(self):
        n, out_len = 4, 5
        with tempfile.TemporaryDirectory() as tmp, FakeIrisServer(token_gap_s=0.003) as srv:
            result = os.path.join(tmp, "r.json")
            r = run_bench(["--target", srv.target, "--dataset", "multiturn", "--num-prompts", str(n),
                           "--output-len", str(out_len), "--max-concurrency", "2", "--no-progress",
                           "--save-result", result, "--seed", "4"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            values = report_values(r.stdout)
            self.assertEqual(values["Successful requests:"], str(2 * n))
            self.assertEqual(values["Total generated tokens:"], str(2 * n * out_len))
            for label in ("Mean TTFT, turn 1 (ms):", "P99 TTFT, turn 1 (ms):", "Mean TTFT, turn 2 (ms):",
                          "Median TTFT, turn 2 (ms):", "P99 TTFT, turn 2 (ms):", "Mean TTFT, turn 1 / turn 2:"):
                self.assertIn(label, values, r.stdout)
            self.assertTrue(r.stdout.endswith("=" * 50 + "\n"))
            by_id = {q.request_id: q for q in srv.requests}
            self.assertEqual(len(by_id), 1 + 2 * n)  # + 1 warmup
            conv = datasets.multiturn_dataset(n, seed=4, output_len=out_len)
            with open(result) as f:
                saved = json.load(f)
            recs = saved["requests"]
            self.assertEqual(sorted((x["index"], x["turn"]) for x in recs),
                             sorted((i, t) for i in range(n) for t in (1, 2)))
            for x in recs:
                q = by_id[x["request_id"]]
                c = conv[x["index"]]
                first = q.messages[0]
                self.assertEqual((first.role, first.content[0].image.data, first.content[1].text),
                                 ("user", c.image, c.prompt))
                if x["turn"] == 1:
                    self.assertEqual(len(q.messages), 1)
                    continue
                self.assertTrue(x["request_id"].endswith("-turn2"))
                t1 = next(y for y in recs if y["index"] == x["index"] and y["turn"] == 1)
                self.assertEqual([m.role for m in q.messages], ["user", "assistant", "user"])
                self.assertEqual(q.messages[1].content[0].text, t1["generated_text"])  # the actual reply
                self.assertEqual(t1["generated_text"], "t0 t1 t2 t3 t4 ")
                self.assertEqual([p.WhichOneof("kind") for p in q.messages[2].content], ["text"])
                self.assertEqual(q.messages[2].content[0].text, c.follow_up)
                # sent only after turn 1 finished
                self.assertGreaterEqual(x["start_time_s"], t1["start_time_s"] + t1["e2el_s"])
            turns = saved["summary"]["turn_ttft_ms"]
            for t in ("1", "2"):
                mean = sum(y["ttft_s"] for y in recs if y["turn"] == int(t)) / n * 1000.0
                self.assertAlmostEqual(turns[t]["mean"], mean, places=6)

    def test_failed_first_turn_leaves_the_second_unsent(self):
        # one conversation at a time, no warmup: requests 3 and 6 (conversations 1 and 3, turn 1) fail
        with tempfile.TemporaryDirectory() as tmp, FakeIrisServer(token_gap_s=0.001, fail_every=3) as srv:
            result = os.path.join(tmp, "r.json")
            r = run_bench(["--target", srv.target, "--dataset", "multiturn", "--num-prompts", "4",
                           "--output-len", "2", "--max-concurrency", "1", "--warmup", "0", "--no-progress",
                           "--save-result", result])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            values = report_values(r.stdout)
            self.assertEqual((values["Successful requests:"], values["Failed requests:"]), ("4", "4"))
            self.assertIn("2 x not sent: turn 1 failed", r.stdout)
            self.assertEqual(len(srv.requests), 6)
            with open(result) as f:
                recs = json.load(f)["requests"]
            failed = sorted((x["index"], x["turn"]) for x in recs if not x["success"])
            self.assertEqual(failed, [(1, 1), (1, 2), (3, 1), (3, 2)])


class MultiturnOpenAITest(NoThreadLeak, unittest.TestCase):
    def test_second_turn_messages(self):
        with FakeOpenAIServer(chunk_gap_s=0.002) as srv:
            r = run_bench(["--backend", "openai-chat", "--target", srv.target, "--dataset", "multiturn",
                           "--num-prompts", "2", "--output-len", "3", "--no-progress", "--warmup", "0"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(report_values(r.stdout)["Successful requests:"], "4")
            seconds = [q for q in srv.requests if len(q["messages"]) == 3]
            self.assertEqual(len(seconds), 2)
            for q in seconds:
                user, assistant, follow = q["messages"]
                self.assertEqual([p["type"] for p in user["content"]], ["image_url", "text"])
                self.assertEqual(assistant, {"role": "assistant", "content": "w0 w1 w2 "})
                self.assertIn(follow["content"][0]["text"], datasets.FOLLOW_UPS)
                first = next(p for p in srv.requests if len(p["messages"]) == 1
                             and p["messages"][0] == user)
                self.assertEqual(first["max_tokens"], 3)


if __name__ == "__main__":
    unittest.main()
