"""iris-bench sweep: throughput mode at each of a list of max-concurrency levels, the way
seed-style stress tests are run (N requests per level), summarised as one table row per level,
a JSON file and PNG plots.

Each level gets its own requests (synthetic and multi-turn data: request indices
level*N .. level*N+N-1 of the same seed), so that no level finds an earlier level's images in
a server-side encoder or prefix cache; a JSONL file is sent as it is at every level.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import List, Optional, Sequence

from .metrics import Metrics, percentile_label

# Percentiles every level computes (the plots draw them); --percentiles adds to these.
SWEEP_PERCENTILES = (50.0, 90.0, 99.0)


def parse_concurrency_list(text: str) -> List[int]:
    """"1,2,4,8" -> [1, 2, 4, 8]: positive integers, strictly increasing (argparse type)."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers such as 1,2,4,8, got {text!r}")
    levels = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {p!r} (in {text!r})") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"concurrency levels must be at least 1, got {v}")
        if levels and v <= levels[-1]:
            raise argparse.ArgumentTypeError(
                f"levels must be strictly increasing, got {v} after {levels[-1]}")
        levels.append(v)
    return levels


@dataclasses.dataclass
class Level:
    """One level of a sweep: its cap, its metrics, its errors and, for multi-turn data, the
    TTFT statistics of each turn (turn -> stats in ms)."""

    max_concurrency: int
    metrics: Metrics
    errors: List[dict]
    turn_ttft_ms: dict = dataclasses.field(default_factory=dict)

    @property
    def requests(self) -> int:
        return self.metrics.completed + self.metrics.failed

    @property
    def success_rate(self) -> float:
        return self.metrics.completed / self.requests if self.requests else 0.0

    def to_json(self) -> dict:
        out = {"max_concurrency": self.max_concurrency, "requests": self.requests,
               "success_rate": self.success_rate, "summary": self.metrics.to_json(),
               "errors": self.errors}
        if self.turn_ttft_ms:
            out["turn_ttft_ms"] = {str(k): v for k, v in self.turn_ttft_ms.items()}
        return out


# (column title, value of a level, format)
_COLUMNS = (
    ("concurrency", lambda l: l.max_concurrency, "{}"),
    ("success", lambda l: l.success_rate * 100.0, "{:.1f}%"),
    ("req/s", lambda l: l.metrics.request_throughput, "{:.2f}"),
    ("output tok/s", lambda l: l.metrics.output_throughput, "{:.2f}"),
    ("mean TTFT (ms)", lambda l: l.metrics.stats_ms["ttft"]["mean"], "{:.2f}"),
    ("P99 TTFT (ms)", lambda l: l.metrics.stats_ms["ttft"]["p99"], "{:.2f}"),
    ("mean TPOT (ms)", lambda l: l.metrics.stats_ms["tpot"]["mean"], "{:.2f}"),
    ("P99 TPOT (ms)", lambda l: l.metrics.stats_ms["tpot"]["p99"], "{:.2f}"),
    ("P99 ITL (ms)", lambda l: l.metrics.stats_ms["itl"]["p99"], "{:.2f}"),
)


def table_header() -> str:
    head = [c for c, _, _ in _COLUMNS]
    return "| " + " | ".join(head) + " |\n" + "|" + "|".join("---:" for _ in head) + "|\n"


def table_row(level: Level) -> str:
    return "| " + " | ".join(fmt.format(get(level)) for _, get, fmt in _COLUMNS) + " |\n"


def format_table(levels: Sequence[Level]) -> str:
    """A Markdown table, one row per level (the rows a sweep prints as it goes)."""
    return table_header() + "".join(table_row(l) for l in levels)


def write_plots(levels: Sequence[Level], plot_dir: str, title: str) -> List[str]:
    """throughput.png (req/s and output tok/s), ttft.png and itl.png (P50/P90/P99, log y axis)
    against the concurrency on a log2 axis; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    xs = [l.max_concurrency for l in levels]
    paths = []

    def axis(ax, ylabel):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("max concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)

    def save(fig, name):
        path = os.path.join(plot_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [l.metrics.request_throughput for l in levels], "o-", color="tab:blue", label="req/s")
    axis(ax, "requests per second")
    ax2 = ax.twinx()
    ax2.plot(xs, [l.metrics.output_throughput for l in levels], "s--", color="tab:orange",
             label="output tok/s")
    ax2.set_ylabel("output tokens per second")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left")
    ax.set_title(f"Throughput vs concurrency\n{title}", fontsize=10)
    save(fig, "throughput.png")

    for name, label in (("ttft", "TTFT"), ("itl", "ITL")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for p, style in zip(SWEEP_PERCENTILES, ("o-", "s-", "^-")):
            key = f"p{percentile_label(p)}"
            ax.plot(xs, [l.metrics.stats_ms[name][key] for l in levels], style,
                    label=f"P{percentile_label(p)}")
        axis(ax, f"{label} (ms, log scale)")
        ax.set_yscale("log")  # a stalled P99 can be 100x the median; both stay readable
        ax.legend(loc="upper left")
        ax.set_title(f"{label} percentiles vs concurrency\n{title}", fontsize=10)
        save(fig, f"{name}.png")
    return paths


def write_comparison_plots(runs: Sequence[tuple], plot_dir: str) -> List[str]:
    """Several sweeps on one set of axes (e.g. one server configuration each): runs are
    (label, saved sweep JSON as --result-json writes it). Writes compare_throughput.png (output
    tok/s), compare_ttft.png (mean and P99) and compare_itl.png (P50 and P99); returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")

    def series(run, key):
        levels = run["levels"]
        return [l["max_concurrency"] for l in levels], [l["summary"].get(key) for l in levels]

    def figure(name, title, ylabel, keys, log_y):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs_all = set()
        for (label, run), color in zip(runs, colors):
            for key, style, suffix in keys:
                xs, ys = series(run, key)
                xs_all.update(xs)
                ax.plot(xs, ys, style, color=color, label=f"{label}{suffix}")
        ticks = sorted(xs_all)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(x) for x in ticks])
        ax.set_xlabel("max concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        path = os.path.join(plot_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    figure("compare_throughput.png", "Output throughput vs concurrency", "output tokens per second",
           [("output_throughput", "o-", "")], False)
    figure("compare_ttft.png", "TTFT vs concurrency", "TTFT (ms, log scale)",
           [("mean_ttft_ms", "o-", " mean"), ("p99_ttft_ms", "^--", " P99")], True)
    figure("compare_itl.png", "ITL vs concurrency", "ITL (ms, log scale)",
           [("p50_itl_ms", "o-", " P50"), ("p99_itl_ms", "^--", " P99")], True)
    return paths


def compare_main(argv: Optional[Sequence[str]] = None) -> int:
    """sweep-compare LABEL=FILE.json ... --plot-dir DIR: the comparison plots, and one Markdown
    table per sweep."""
    import argparse
    import json
    p = argparse.ArgumentParser(prog="sweep-compare",
                                description="Plot several iris-bench sweeps (--result-json files) together.")
    p.add_argument("runs", nargs="+", metavar="LABEL=FILE.json")
    p.add_argument("--plot-dir", required=True, metavar="DIR")
    args = p.parse_args(argv)
    runs = []
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            p.error(f"runs: expected LABEL=FILE.json, got {item!r}")
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"runs: cannot read {path}: {e}")
        if not isinstance(data, dict) or not data.get("levels"):
            p.error(f"runs: {path} is not a sweep result (no levels)")
        runs.append((label, data))
    for path in write_comparison_plots(runs, args.plot_dir):
        print(path)
    return 0
