"""iris-bench metrics and report on hand-computed request records."""

import unittest

import fakes  # noqa: F401  (puts bench/ on sys.path)
from iris_bench import metrics, runner
from iris_bench.metrics import RequestRecord as R


def hand_records():
    """Seven requests of a run lasting 2.5 s (times in seconds from the benchmark start).

    ok  start ttft  itl               e2el  tokens (server/counted)  token chunk times
    r0  0.0   0.5   .25 .25 .5        1.5   4                        0.5 0.75 1.0 1.5
    r1  0.5   1.0   .5                1.5   2                        1.5 2.0
    r2  2.0   0.25  -                 0.25  1 (no TPOT)              2.25
    r6  1.2   0.3   .1 .1             0.5   none / 3 counted         1.5 1.6 1.7
    r3, r4 fail "UNAVAILABLE: down"; r5 fails "HTTP 500 Internal Server Error: boom"; their
    numbers (a huge ttft and latency) must not leak into any statistic.

    prompt/image tokens: r0 100/60, r1 50/0, r2 30/10, r6 20/5.
    """
    return [
        R(index=0, success=True, start_time=0.0, ttft=0.5, itl=[0.25, 0.25, 0.5], latency=1.5,
          output_tokens=4, counted_tokens=4, prompt_tokens=100, image_tokens=60),
        R(index=1, success=True, start_time=0.5, ttft=1.0, itl=[0.5], latency=1.5,
          output_tokens=2, counted_tokens=2, prompt_tokens=50, image_tokens=0),
        R(index=2, success=True, start_time=2.0, ttft=0.25, itl=[], latency=0.25,
          output_tokens=1, counted_tokens=1, prompt_tokens=30, image_tokens=10),
        R(index=3, success=False, error="UNAVAILABLE: down", start_time=0.1, ttft=9.0,
          itl=[9.0], latency=50.0, output_tokens=7, prompt_tokens=1000),
        R(index=4, success=False, error="UNAVAILABLE: down", start_time=0.2, latency=40.0),
        R(index=5, success=False, error="HTTP 500 Internal Server Error: boom", start_time=0.3),
        R(index=6, success=True, start_time=1.2, ttft=0.3, itl=[0.1, 0.1], latency=0.5,
          output_tokens=None, counted_tokens=3, prompt_tokens=20, image_tokens=5),
    ]


# The report for hand_records() over 2.5 s, --max-concurrency 16, --request-rate 10:
#   completed 4, failed 3; output tokens 4+2+1+3 = 10; input 100+50+30+20 = 200.
#   request throughput 4/2.5 = 1.60; output 10/2.5 = 4.00; total (200+10)/2.5 = 84.00.
#   Peak output: 1-s buckets from t0 = 0 (the earliest successful start): bucket 0 holds
#     0.5, 0.75 (2); bucket 1 holds 1.0, 1.5 (r0), 1.5 (r1), 1.5, 1.6, 1.7 (r6) = 6;
#     bucket 2 holds 2.0 (r1), 2.25 (r2) = 2 -> 6.00.
#   Peak concurrency over [start, end): r0 [0,1.5), r1 [.5,2), r6 [1.2,1.7), r2 [2,2.25):
#     3 at t = 1.2 (r2 starts exactly when r1 ends: not counted together) -> 3.00.
#   TTFT [.25 .3 .5 1.0]: mean 2.05/4 = 512.50 ms; median (.3+.5)/2 = 400.00;
#     P99 at rank .99*3 = 2.97: .5 + .97*(1.0-.5) = 985.00.
#   TPOT r0 (1.5-.5)/3 = 1/3, r1 (1.5-1)/1 = .5, r6 (.5-.3)/2 = .1 (r2 has 1 token: out):
#     mean .93333/3 = 311.11; median 333.33; P99 rank 1.98: 1/3 + .98*(1/6) = 496.67.
#   ITL pooled [.1 .1 .25 .25 .5 .5]: mean 1.7/6 = 283.33; median 250.00; P99 rank 4.95
#     between .5 and .5 = 500.00.
EXPECTED_REPORT = """\
============ Serving Benchmark Result ============
Successful requests:                     4
Failed requests:                         3
Maximum request concurrency:             16
Request rate configured (RPS):           10.00
Benchmark duration (s):                  2.50
Total input tokens:                      200
Total generated tokens:                  10
Request throughput (req/s):              1.60
Output token throughput (tok/s):         4.00
Peak output token throughput (tok/s):    6.00
Peak concurrent requests:                3.00
Total token throughput (tok/s):          84.00
---------------Time to First Token----------------
Mean TTFT (ms):                          512.50
Median TTFT (ms):                        400.00
P99 TTFT (ms):                           985.00
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          311.11
Median TPOT (ms):                        333.33
P99 TPOT (ms):                           496.67
---------------Inter-token Latency----------------
Mean ITL (ms):                           283.33
Median ITL (ms):                         250.00
P99 ITL (ms):                            500.00
==================================================
"""

# DESIGN.md's example block, character for character.
DESIGN_BLOCK = """\
============ Serving Benchmark Result ============
Successful requests:                     500
Failed requests:                         0
Maximum request concurrency:             16
Request rate configured (RPS):           10.00
Benchmark duration (s):                  206.06
Total input tokens:                      33418
Total generated tokens:                  61516
Request throughput (req/s):              2.43
Output token throughput (tok/s):         298.53
Peak output token throughput (tok/s):    528.00
Peak concurrent requests:                30.00
Total token throughput (tok/s):          460.70
---------------Time to First Token----------------
Mean TTFT (ms):                          945.18
Median TTFT (ms):                        570.38
P99 TTFT (ms):                           5986.31
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          45.69
Median TPOT (ms):                        44.78
P99 TPOT (ms):                           95.71
---------------Inter-token Latency----------------
Mean ITL (ms):                           53.99
Median ITL (ms):                         32.90
P99 ITL (ms):                            383.97
==================================================
"""


class MetricsTest(unittest.TestCase):
    def setUp(self):
        self.m = metrics.compute_metrics(hand_records(), duration=2.5)

    def test_counts_and_totals(self):
        m = self.m
        self.assertEqual((m.completed, m.failed), (4, 3))
        self.assertEqual(m.total_output, 10)  # r6 falls back to its 3 counted tokens
        self.assertEqual(m.total_input, 200)
        self.assertAlmostEqual(m.request_throughput, 1.6)
        self.assertAlmostEqual(m.output_throughput, 4.0)
        self.assertAlmostEqual(m.total_token_throughput, 84.0)

    def test_text_only_input_tokens(self):
        m = metrics.compute_metrics(hand_records(), duration=2.5, text_only_input_tokens=True)
        # 100-60 + 50-0 + 30-10 + 20-5 = 125; (125 + 10) / 2.5 = 54
        self.assertEqual(m.total_input, 125)
        self.assertAlmostEqual(m.total_token_throughput, 54.0)
        self.assertEqual(m.total_output, 10)

    def test_ttft(self):
        s = self.m.stats_ms["ttft"]
        self.assertAlmostEqual(s["mean"], 512.5)
        self.assertAlmostEqual(s["median"], 400.0)
        self.assertAlmostEqual(s["p99"], 985.0)

    def test_tpot_excludes_one_token_requests(self):
        s = self.m.stats_ms["tpot"]
        self.assertAlmostEqual(s["mean"], (1 / 3 + 0.5 + 0.1) / 3 * 1000)
        self.assertAlmostEqual(s["median"], 1000 / 3)
        self.assertAlmostEqual(s["p99"], (1 / 3 + 0.98 * (0.5 - 1 / 3)) * 1000)

    def test_itl_pooled(self):
        s = self.m.stats_ms["itl"]
        self.assertAlmostEqual(s["mean"], 1.7 / 6 * 1000)
        self.assertAlmostEqual(s["median"], 250.0)
        self.assertAlmostEqual(s["p99"], 500.0)

    def test_e2el(self):
        s = self.m.stats_ms["e2el"]  # [.25 .5 1.5 1.5]
        self.assertAlmostEqual(s["mean"], 937.5)
        self.assertAlmostEqual(s["median"], 1000.0)
        self.assertAlmostEqual(s["p99"], 1500.0)

    def test_peaks(self):
        self.assertEqual(self.m.max_output_tokens_per_s, 6.0)
        self.assertEqual(self.m.max_concurrent_requests, 3)

    def test_failed_requests_change_nothing_but_the_count(self):
        ok_only = [r for r in hand_records() if r.success]
        m2 = metrics.compute_metrics(ok_only, duration=2.5)
        self.assertEqual(m2.failed, 0)
        self.assertEqual(m2.stats_ms, self.m.stats_ms)
        self.assertEqual((m2.total_input, m2.total_output), (self.m.total_input, self.m.total_output))
        self.assertEqual(m2.max_concurrent_requests, self.m.max_concurrent_requests)
        self.assertEqual(m2.max_output_tokens_per_s, self.m.max_output_tokens_per_s)

    def test_all_failed(self):
        m = metrics.compute_metrics([r for r in hand_records() if not r.success], duration=1.0)
        self.assertEqual((m.completed, m.failed, m.total_output), (0, 3, 0))
        self.assertEqual(m.stats_ms["ttft"]["mean"], 0.0)
        self.assertEqual((m.max_output_tokens_per_s, m.max_concurrent_requests), (0.0, 0))

    def test_peak_concurrency_touching_intervals(self):
        pc = metrics.peak_concurrency
        self.assertEqual(pc([]), 0)
        self.assertEqual(pc([(0, 1), (1, 2), (2, 3)]), 1)          # end == next start
        self.assertEqual(pc([(0, 1), (0.999, 2)]), 2)
        self.assertEqual(pc([(0, 2), (1, 2), (2, 3)]), 2)          # two end as one starts
        self.assertEqual(pc([(0, 5), (1, 2), (1, 3), (2, 4)]), 3)  # at 1: 3; at 2: 3 (one ends)
        self.assertEqual(pc([(0, 10)] * 4 + [(10, 11)]), 4)

    def test_peak_output_buckets(self):
        # t0 = 10.0 (the earliest start); chunks at 10.0, 10.9 (bucket 0); 11.0 (a), 11.5,
        # 11.99 (b) (bucket 1: floor, not round); 13.98 (bucket 3) -> peak 3.
        a = R(index=0, success=True, start_time=10.0, ttft=0.0, itl=[0.9, 0.1], latency=1.0)
        b = R(index=1, success=True, start_time=11.0, ttft=0.5, itl=[0.49, 1.99], latency=2.98)
        self.assertEqual(metrics.peak_output_per_second([a, b]), 3.0)
        self.assertEqual(metrics.peak_output_per_second([b]), 2.0)
        self.assertEqual(metrics.peak_output_per_second([]), 0.0)


class ReportTest(unittest.TestCase):
    def test_hand_report_exact(self):
        m = metrics.compute_metrics(hand_records(), duration=2.5)
        self.assertEqual(metrics.format_report(m, max_concurrency=16, request_rate=10.0), EXPECTED_REPORT)

    def test_design_block_exact(self):
        stats = {
            "ttft": {"mean": 945.18, "median": 570.38, "p99": 5986.31},
            "tpot": {"mean": 45.69, "median": 44.78, "p99": 95.71},
            "itl": {"mean": 53.99, "median": 32.90, "p99": 383.97},
            "e2el": {"mean": 0.0, "median": 0.0, "p99": 0.0},
        }
        m = metrics.Metrics(completed=500, failed=0, duration=206.06, total_input=33418,
                            total_output=61516, request_throughput=2.43, output_throughput=298.53,
                            max_output_tokens_per_s=528.0, max_concurrent_requests=30,
                            total_token_throughput=460.70, stats_ms=stats)
        self.assertEqual(metrics.format_report(m, max_concurrency=16, request_rate=10), DESIGN_BLOCK)
        for line in DESIGN_BLOCK.splitlines()[1:-1]:
            if not line.startswith("-"):
                self.assertEqual(line[41:42].strip() != "", True, line)  # values at column 42
                self.assertEqual(line[40], " ", line)

    def test_optional_lines(self):
        m = metrics.compute_metrics(hand_records(), duration=2.5)
        text = metrics.format_report(m)  # throughput mode, no concurrency cap
        self.assertNotIn("Maximum request concurrency", text)
        self.assertNotIn("Request rate configured", text)
        self.assertEqual(text, EXPECTED_REPORT.replace(
            "Maximum request concurrency:             16\n", "").replace(
            "Request rate configured (RPS):           10.00\n", ""))
        text = metrics.format_report(m, request_rate=float("inf"), max_concurrency=4)
        self.assertIn("Maximum request concurrency:             4\n", text)
        self.assertNotIn("Request rate configured", text)

    def test_percentiles_and_sections(self):
        m = metrics.compute_metrics(hand_records(), duration=2.5, percentiles=(50, 99.9))
        text = metrics.format_report(m, percentiles=(50, 99.9), percentile_metrics=("ttft", "e2el"))
        self.assertIn("P50 TTFT (ms):                           400.00\n", text)
        self.assertIn("P99.9 TTFT (ms):", text)
        self.assertIn("----------------End-to-end Latency----------------\n", text)
        self.assertIn("Median E2EL (ms):                        1000.00\n", text)
        self.assertNotIn("TPOT", text)
        self.assertNotIn("P99 TTFT", text)

    def test_error_summary(self):
        self.assertEqual(metrics.format_errors(hand_records()),
                         "Errors (3 of 7 requests failed):\n"
                         "  2 x UNAVAILABLE: down\n"
                         "  1 x HTTP 500 Internal Server Error: boom\n")
        self.assertEqual(metrics.format_errors([r for r in hand_records() if r.success]), "")


class ArrivalTest(unittest.TestCase):
    def test_throughput_mode_sends_at_once(self):
        self.assertEqual(runner.arrival_offsets(5, float("inf"), 1.0, 0), [0.0] * 5)

    def test_latency_mode_schedule(self):
        a = runner.arrival_offsets(500, 10.0, 5.0, seed=3)
        self.assertEqual(a, runner.arrival_offsets(500, 10.0, 5.0, seed=3))  # seeded
        self.assertNotEqual(a, runner.arrival_offsets(500, 10.0, 5.0, seed=4))
        self.assertTrue(all(x < y for x, y in zip(a, a[1:])))
        self.assertAlmostEqual(a[-1], 50.0)  # scaled to n / rate, as vLLM does

    def test_burstiness_shapes_the_gaps(self):
        import numpy as np

        def cv(b):
            a = np.diff([0.0] + runner.arrival_offsets(4000, 10.0, b, seed=1))
            return a.std() / a.mean()
        self.assertAlmostEqual(cv(1.0), 1.0, delta=0.08)            # exponential: cv 1
        self.assertAlmostEqual(cv(5.0), 1 / 5 ** 0.5, delta=0.05)   # gamma(k): cv 1/sqrt(k)
        self.assertEqual(len(set(np.round(np.diff(runner.arrival_offsets(10, 4.0, float("inf"), 0)), 9))), 1)


class AblationTableTest(unittest.TestCase):
    def test_change_and_table(self):
        from iris_bench import ablation
        self.assertEqual(ablation.change(103.1, 100.0), "+3.1%")
        self.assertEqual(ablation.change(98.0, 100.0), "-2.0%")
        self.assertEqual(ablation.change(1.0, 0.0), "n/a")
        self.assertEqual(ablation.server_flags(ablation.CONFIGS["all off"]),
                         ["--fused_rotary=false", "--parallel_qkv_padding=false", "--cached_cu_seqlens=false"])
        self.assertEqual(ablation.server_flags(ablation.CONFIGS["all on"]), [])
        keys = [k for _, k in ablation.COLUMNS]
        on = dict({k: 100.0 for k in keys}, failed=0)
        off = dict({k: 110.0 for k in keys}, output_throughput=50.0, failed=2)
        table = ablation.markdown_table([{"config": "all on", "summary": on},
                                         {"config": "all off", "summary": off}])
        self.assertEqual(table.splitlines(), [
            "| config | mean TTFT (ms) | median TTFT (ms) | P99 TTFT (ms) | mean TPOT (ms) | median TPOT (ms) "
            "| P99 TPOT (ms) | output throughput (tok/s) | failed |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            "| all on | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 | 0 |",
            "| all off | 110.00 (+10.0%) | 110.00 (+10.0%) | 110.00 (+10.0%) | 110.00 (+10.0%) "
            "| 110.00 (+10.0%) | 110.00 (+10.0%) | 50.00 (-50.0%) | 2 |",
        ])

    def test_scheduling_table_has_the_itl_ratio(self):
        from iris_bench import ablation
        configs, columns, base = ablation.SUITES["scheduling"]
        self.assertEqual(base, "encoder sharing the cores")  # the CPU server's default
        self.assertEqual(configs["interleave off"], ["--encoder_cpus=off", "--interleave_encoder=false"])
        keys = [k for _, k in columns if k != "itl_p99_over_median"]
        on = dict({k: 100.0 for k in keys}, median_itl_ms=50.0, p99_itl_ms=100.0, failed=0)
        off = dict({k: 100.0 for k in keys}, median_itl_ms=40.0, p99_itl_ms=4000.0, failed=0)
        table = ablation.markdown_table([{"config": base, "summary": on},
                                         {"config": "interleave off", "summary": off}], base, columns)
        lines = table.splitlines()
        self.assertIn("| P99/median ITL |", lines[0])
        self.assertIn("| 2.00 |", lines[2])
        self.assertIn("| 100.00 (+4900.0%) |", lines[3])


if __name__ == "__main__":
    unittest.main()
