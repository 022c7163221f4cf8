"""Benchmark metrics and the report, defined as `vllm bench serve` defines them.

Per request (successful ones only; failed requests are counted and excluded from everything
else):

* TTFT: send → the first streamed chunk that carries text or tokens.
* E2EL: send → the last chunk that carries text or tokens.
* TPOT: (E2EL − TTFT) / (output_tokens − 1), only for requests with output_tokens > 1.
* ITL: the gaps between consecutive token-carrying chunks, pooled over all requests.
* output_tokens: the server's completion usage; when the server reports none, the tokens
  counted from the stream (token ids, or token-carrying chunks for OpenAI servers).
* input tokens: the server-reported prompt tokens, image tokens included; with
  `text_only_input_tokens` the prompt tokens minus the image tokens.

Over the run of `duration` seconds: request throughput = completed / duration; output token
throughput = total output / duration; total token throughput = (input + output) / duration;
peak output token throughput = the most token-carrying chunks in one 1-second bucket, the
buckets counted from the earliest successful request's start; peak concurrent requests = the
most requests in flight at once, by an exact sweep over half-open [start, end) intervals (a
request ending exactly when another starts does not overlap it). Percentiles are numpy's
default (linear interpolation); an empty list gives 0, as in vLLM.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclasses.dataclass
class RequestRecord:
    """What one request did, as seen by the client. Times are seconds; `start_time` is
    relative to the benchmark start."""

    index: int
    turn: int = 1                         # multi-turn data: 1 or 2; single-turn requests: 1
    request_id: str = ""
    success: bool = False
    error: str = ""                       # one line: "CODE: message" / "HTTP 500 ...: body"
    start_time: float = 0.0
    ttft: float = 0.0
    itl: List[float] = dataclasses.field(default_factory=list)
    latency: float = 0.0                  # E2EL
    prompt_tokens: Optional[int] = None   # server-reported, image tokens included
    image_tokens: Optional[int] = None    # server-reported (or estimated, see image_tokens_source)
    image_tokens_source: str = "server"
    output_tokens: Optional[int] = None   # server-reported completion tokens
    counted_tokens: int = 0               # tokens counted from the stream
    chunks: int = 0                       # token-carrying chunks received
    expected_output_len: int = 0
    finish_reason: str = ""
    generated_text: str = ""
    server_timings: Optional[Dict[str, float]] = None

    def add_chunk(self, now: float, start: float, last: float) -> None:
        """Counts a chunk with content that arrived at `now` (perf_counter seconds, like
        `start`, when the request was sent, and `last`, when the previous chunk arrived): the
        first sets `ttft`, each later one adds its gap to `itl`."""
        if self.chunks == 0:
            self.ttft = now - start
        else:
            self.itl.append(now - last)
        self.chunks += 1

    def output_len(self) -> int:
        """Output tokens as the metrics count them (server usage, else counted, else 1)."""
        if self.output_tokens:
            return int(self.output_tokens)
        if self.counted_tokens:
            return int(self.counted_tokens)
        return 1

    def input_len(self, text_only: bool) -> int:
        prompt = int(self.prompt_tokens or 0)
        if text_only:
            return max(0, prompt - int(self.image_tokens or 0))
        return prompt

    def token_times(self) -> List[float]:
        """Arrival times (relative to the benchmark start) of the token-carrying chunks."""
        t = self.start_time + self.ttft
        times = [t]
        for gap in self.itl:
            t += gap
            times.append(t)
        return times

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "turn": self.turn,
            "request_id": self.request_id,
            "success": self.success,
            "error": self.error,
            "start_time_s": self.start_time,
            "ttft_s": self.ttft,
            "itl_s": list(self.itl),
            "e2el_s": self.latency,
            "prompt_tokens": self.prompt_tokens,
            "image_tokens": self.image_tokens,
            "image_tokens_source": self.image_tokens_source,
            "output_tokens": self.output_tokens,
            "counted_tokens": self.counted_tokens,
            "chunks": self.chunks,
            "expected_output_len": self.expected_output_len,
            "finish_reason": self.finish_reason,
            "generated_text": self.generated_text,
            "server_timings_ms": self.server_timings,
        }


@dataclasses.dataclass
class Metrics:
    completed: int
    failed: int
    duration: float
    total_input: int
    total_output: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    # name ("ttft", "tpot", "itl", "e2el") -> {"mean", "median", "std", "p<P>"} in ms
    stats_ms: Dict[str, Dict[str, float]]

    def to_json(self) -> dict:
        out = {
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration,
            "total_input_tokens": self.total_input,
            "total_output_tokens": self.total_output,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for name, stats in self.stats_ms.items():
            for key, value in stats.items():
                out[f"{key}_{name}_ms"] = value
        return out


def percentile_label(p: float) -> str:
    """99 -> "99", 99.9 -> "99.9" (as vLLM names them)."""
    return str(int(p)) if int(p) == p else str(p)


def _stats_ms(values: Sequence[float], percentiles: Sequence[float]) -> Dict[str, float]:
    data = list(values) if values else [0.0]
    out = {
        "mean": float(np.mean(data)) * 1000.0,
        "median": float(np.median(data)) * 1000.0,
        "std": float(np.std(data)) * 1000.0,
    }
    for p in percentiles:
        out[f"p{percentile_label(p)}"] = float(np.percentile(data, p)) * 1000.0
    return out


def peak_concurrency(intervals: Sequence[Tuple[float, float]]) -> int:
    """Most intervals open at once; intervals are half-open [start, end), so at a tie the
    end is processed before the start."""
    events = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def peak_output_per_second(records: Sequence[RequestRecord]) -> float:
    """The most token-carrying chunks in one 1-second bucket; buckets start at the earliest
    successful request's start."""
    if not records:
        return 0.0
    t0 = min(r.start_time for r in records)
    t_end = max(r.start_time + r.latency for r in records)
    buckets = np.zeros(int(np.ceil(t_end - t0)) + 1)
    for r in records:
        for t in r.token_times():
            b = int(t - t0)
            if 0 <= b < len(buckets):
                buckets[b] += 1
    return float(buckets.max()) if len(buckets) else 0.0


def compute_metrics(records: Sequence[RequestRecord], duration: float,
                    text_only_input_tokens: bool = False,
                    percentiles: Sequence[float] = (99,)) -> Metrics:
    ok = [r for r in records if r.success]
    failed = len(records) - len(ok)
    ttfts, tpots, itls, e2els = [], [], [], []
    total_input = total_output = 0
    for r in ok:
        out_len = r.output_len()
        total_output += out_len
        total_input += r.input_len(text_only_input_tokens)
        if out_len > 1:
            tpots.append((r.latency - r.ttft) / (out_len - 1))
        itls.extend(r.itl)
        ttfts.append(r.ttft)
        e2els.append(r.latency)
    dur = duration if duration > 0 else float("nan")
    return Metrics(
        completed=len(ok),
        failed=failed,
        duration=duration,
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(ok) / dur,
        output_throughput=total_output / dur,
        total_token_throughput=(total_input + total_output) / dur,
        max_output_tokens_per_s=peak_output_per_second(ok),
        max_concurrent_requests=peak_concurrency([(r.start_time, r.start_time + r.latency) for r in ok]),
        stats_ms={
            "ttft": _stats_ms(ttfts, percentiles),
            "tpot": _stats_ms(tpots, percentiles),
            "itl": _stats_ms(itls, percentiles),
            "e2el": _stats_ms(e2els, percentiles),
        },
    )


def turn_ttft_ms(records: Sequence[RequestRecord],
                 percentiles: Sequence[float] = (99,)) -> Dict[int, Dict[str, float]]:
    """Multi-turn data: turn -> TTFT stats (ms) over that turn's successful requests; empty
    when every request is a first turn."""
    turns = sorted({r.turn for r in records})
    if turns in ([], [1]):
        return {}
    return {t: _stats_ms([r.ttft for r in records if r.success and r.turn == t], percentiles)
            for t in turns}


_SECTIONS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


def _line(label: str, value) -> str:
    # vLLM's "{:<40} {:<10}": the value starts at column 42; trailing padding dropped.
    return "{:<40} {:<10}".format(label, value).rstrip()


def format_report(m: Metrics, max_concurrency: Optional[int] = None,
                  request_rate: Optional[float] = None,
                  percentiles: Sequence[float] = (99,),
                  percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
                  turn_ttft: Optional[Dict[int, Dict[str, float]]] = None) -> str:
    """The report block of DESIGN.md ("The serving benchmark's report"), newline-terminated.
    `request_rate` None or inf leaves out the configured-rate line; `turn_ttft` (multi-turn
    data, from turn_ttft_ms) adds a section with each turn's TTFT."""
    f2 = "{:.2f}".format
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    lines.append(_line("Successful requests:", m.completed))
    lines.append(_line("Failed requests:", m.failed))
    if max_concurrency is not None:
        lines.append(_line("Maximum request concurrency:", max_concurrency))
    if request_rate is not None and request_rate != float("inf"):
        lines.append(_line("Request rate configured (RPS):", f2(request_rate)))
    lines.append(_line("Benchmark duration (s):", f2(m.duration)))
    lines.append(_line("Total input tokens:", m.total_input))
    lines.append(_line("Total generated tokens:", m.total_output))
    lines.append(_line("Request throughput (req/s):", f2(m.request_throughput)))
    lines.append(_line("Output token throughput (tok/s):", f2(m.output_throughput)))
    lines.append(_line("Peak output token throughput (tok/s):", f2(m.max_output_tokens_per_s)))
    lines.append(_line("Peak concurrent requests:", f2(m.max_concurrent_requests)))
    lines.append(_line("Total token throughput (tok/s):", f2(m.total_token_throughput)))
    for name in ("ttft", "tpot", "itl", "e2el"):
        if name not in percentile_metrics:
            continue
        short, header = _SECTIONS[name]
        stats = m.stats_ms[name]
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append(_line(f"Mean {short} (ms):", f2(stats["mean"])))
        lines.append(_line(f"Median {short} (ms):", f2(stats["median"])))
        for p in percentiles:
            label = percentile_label(p)
            lines.append(_line(f"P{label} {short} (ms):", f2(stats[f"p{label}"])))
    if turn_ttft:
        lines.append("{s:{c}^{n}}".format(s="Time to First Token per Turn", n=50, c="-"))
        for turn, stats in sorted(turn_ttft.items()):
            lines.append(_line(f"Mean TTFT, turn {turn} (ms):", f2(stats["mean"])))
            lines.append(_line(f"Median TTFT, turn {turn} (ms):", f2(stats["median"])))
            for p in percentiles:
                label = percentile_label(p)
                lines.append(_line(f"P{label} TTFT, turn {turn} (ms):", f2(stats[f"p{label}"])))
        if 1 in turn_ttft and 2 in turn_ttft and turn_ttft[2]["mean"] > 0:
            lines.append(_line("Mean TTFT, turn 1 / turn 2:", f2(turn_ttft[1]["mean"] / turn_ttft[2]["mean"])))
    lines.append("=" * 50)
    return "\n".join(lines) + "\n"


def error_counts(records: Sequence[RequestRecord]) -> List[Tuple[str, int]]:
    """(error, count) over failed requests, most frequent first."""
    counter = collections.Counter(r.error or "unknown error" for r in records if not r.success)
    return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))


def format_errors(records: Sequence[RequestRecord]) -> str:
    """The failed requests grouped by status and message; empty when none failed."""
    groups = error_counts(records)
    if not groups:
        return ""
    failed = sum(n for _, n in groups)
    lines = [f"Errors ({failed} of {len(records)} requests failed):"]
    width = len(str(groups[0][1]))
    for message, count in groups:
        lines.append(f"  {count:>{width}} x {message}")
    return "\n".join(lines) + "\n"
