"""ablation: iris-server's techniques switched off one at a time, measured with iris-bench.

Two suites. `encoder` (the default): all on; fused rotary off; parallel q/k/v padding off; cached
cu_seqlens off; all off. `scheduling`: the encoder on its own thread sharing the engine's cores
(--encoder-cpus shared, the CPU server's default); the interleaved encoder (slices between engine
steps) with the automatic step budget; the same at a 1 ms budget (the latency extreme: the
smallest slices); interleaving off (whole images in the admitting step, prefill bounded only by
max_num_batched_tokens: the throughput extreme); the encoder on a core of its own (the last CPU,
its thread and team there, beside the engine's on the others: --encoder-cpus / --engine-cpus). For each configuration and each mode (throughput, latency) it starts a fresh iris-server on
port 0 (so no run finds another's images in the server's encoder cache), checks through
GetModelInfo that the switches took, runs iris-bench (the same dataset and seed every time),
stops the server with SIGTERM and waits for it; then it prints one Markdown table per mode
with the change against "all on".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from .proto import REPO_ROOT, load_stubs
from .server_proc import IrisServer, ServerError

TECHNIQUES = ("fused_rotary", "parallel_qkv_padding", "cached_cu_seqlens")
CONFIGS = {
    "all on": {},
    "fused rotary off": {"fused_rotary": False},
    "parallel qkv padding off": {"parallel_qkv_padding": False},
    "cached cu_seqlens off": {"cached_cu_seqlens": False},
    "all off": {t: False for t in TECHNIQUES},
}
# (column title, summary key) of the tables
COLUMNS = (
    ("mean TTFT (ms)", "mean_ttft_ms"), ("median TTFT (ms)", "median_ttft_ms"),
    ("P99 TTFT (ms)", "p99_ttft_ms"), ("mean TPOT (ms)", "mean_tpot_ms"),
    ("median TPOT (ms)", "median_tpot_ms"), ("P99 TPOT (ms)", "p99_tpot_ms"),
    ("output throughput (tok/s)", "output_throughput"),
)
# The scheduling suite: configuration -> iris-server flags; its table adds the ITL columns (the
# step budget exists for them) and the P99 / median ITL ratio.
def _encoder_beside_flags() -> List[str]:
    """The CPUs this process may use split in two: the last one for the encoder's own thread and
    team (--encoder-cpus), the rest for the engine's (--engine-cpus). On a GPU server the encoder
    has a stream of its own by default instead."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return ["--encoder_cpus=needs-two-cpus"]  # refused by the server, with why
    return [f"--engine_cpus={','.join(map(str, cpus[:-1]))}", f"--encoder_cpus={cpus[-1]}"]


SCHEDULING_CONFIGS = {
    "encoder sharing the cores": ["--encoder_cpus=shared"],
    "interleaved (auto budget)": ["--encoder_cpus=off"],
    "interleaved (1 ms budget)": ["--encoder_cpus=off", "--step_budget_ms=1"],
    "interleave off": ["--encoder_cpus=off", "--interleave_encoder=false"],
    "encoder on its own core": _encoder_beside_flags(),
}
SCHEDULING_COLUMNS = (
    ("mean TTFT (ms)", "mean_ttft_ms"), ("P99 TTFT (ms)", "p99_ttft_ms"),
    ("median ITL (ms)", "median_itl_ms"), ("P99 ITL (ms)", "p99_itl_ms"),
    ("P99/median ITL", "itl_p99_over_median"), ("mean TPOT (ms)", "mean_tpot_ms"),
    ("output throughput (tok/s)", "output_throughput"),
)
SUITES = {
    "encoder": (CONFIGS, COLUMNS, "all on"),
    "scheduling": (SCHEDULING_CONFIGS, SCHEDULING_COLUMNS, "encoder sharing the cores"),
}
IRIS_BENCH = os.path.join(REPO_ROOT, "bench", "iris-bench")


def server_flags(config: Dict[str, bool]) -> List[str]:
    return [f"--{t}=false" for t in TECHNIQUES if config.get(t) is False]


def change(value: float, base: float) -> str:
    """"+3.1%" style change of value against base ("n/a" when base is 0)."""
    if not base:
        return "n/a"
    return f"{(value - base) / base * 100.0:+.1f}%"


def markdown_table(rows: List[dict], base_name: str = "all on", columns=COLUMNS) -> str:
    """rows: {"config": name, "summary": iris-bench summary dict}; the first row named
    base_name is the reference for the changes."""
    for r in rows:
        s = r["summary"]
        if s.get("median_itl_ms"):
            s["itl_p99_over_median"] = (s.get("p99_itl_ms") or 0.0) / s["median_itl_ms"]
    base = next((r["summary"] for r in rows if r["config"] == base_name), None)
    head = ["config"] + [c for c, _ in columns] + ["failed"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in rows:
        s = r["summary"]
        cells = [r["config"]]
        for _, key in columns:
            v = s.get(key)
            if v is None:
                cells.append("n/a")
            elif base is None or r["config"] == base_name:
                cells.append(f"{v:.2f}")
            else:
                cells.append(f"{v:.2f} ({change(v, base.get(key) or 0.0)})")
        cells.append(str(s.get("failed", 0)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ablation",
        description="Measure each encoder technique of iris-server by switching it off (throughput "
                    "and latency modes of iris-bench). Tables go to stdout; progress to stderr. "
                    "Arguments after `--` go to iris-server as they are.",
        epilog="Example:\n  bench/ablation --model /models/Qwen2.5-VL-3B-Instruct --out ablation.json\n"
               "  bench/ablation --model build/test-models/tiny --num-prompts 24 --output-len 16 "
               "-- --max_pixels=200704",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder for iris-server --model")
    p.add_argument("--server-bin", default=os.path.join(REPO_ROOT, "build", "server", "iris-server"),
                   help="iris-server binary (default %(default)s)")
    p.add_argument("--num-prompts", type=int, default=500, help="requests per run (default 500)")
    p.add_argument("--max-concurrency", type=int, default=16, help="throughput mode's cap (default 16)")
    p.add_argument("--request-rate", type=float, default=10.0, help="latency mode's rate (default 10)")
    p.add_argument("--burstiness", type=float, default=5.0, help="latency mode's burstiness (default 5)")
    p.add_argument("--latency-max-concurrency", type=int, default=None,
                   help="also cap concurrency in latency mode (default: no cap)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens per request (default 128)")
    p.add_argument("--seed", type=int, default=0, help="dataset and arrival seed (default 0)")
    p.add_argument("--dtype", default="bf16", help="iris-server --dtype (default bf16)")
    p.add_argument("--modes", default="throughput,latency", help="modes to run (default throughput,latency)")
    p.add_argument("--suite", choices=tuple(SUITES), default="encoder",
                   help="encoder techniques, or the scheduling of encoder and prefill work (default encoder)")
    p.add_argument("--configs", default=None,
                   help="comma-separated configurations of the suite to run (default: all, the reference first)")
    p.add_argument("--extra-server-args", default="", help="more iris-server flags, one shell-quoted string")
    p.add_argument("--bench-args", default="", help="more iris-bench flags, one shell-quoted string "
                                                    "(e.g. \"--dataset jsonl --dataset-path F\")")
    p.add_argument("--startup-timeout-s", type=float, default=900.0, help="wait for the server (default 900)")
    p.add_argument("--out", help="write the raw results (JSON) here")
    p.add_argument("--keep-records", action="store_true", help="keep per-request records in --out")
    p.add_argument("--log-dir", help="keep each server's stderr and bench output here")
    return p


def model_info(target: str) -> dict:
    import grpc
    pb2, pb2_grpc = load_stubs()
    with grpc.insecure_channel(target) as ch:
        info = pb2_grpc.IrisStub(ch).GetModelInfo(pb2.GetModelInfoRequest(), timeout=30)
    t = info.encoder_techniques
    return {"model": info.model, "dtype": info.dtype, "server_version": info.server_version,
            "encoder_techniques": {"fused_rotary": t.fused_rotary,
                                   "parallel_qkv_padding": t.parallel_qkv_padding,
                                   "cached_cu_seqlens": t.cached_cu_seqlens}}


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_bench(args, target: str, mode: str, result_path: str, log) -> dict:
    cmd = [sys.executable, IRIS_BENCH, "--target", target, "--mode", mode,
           "--num-prompts", str(args.num_prompts), "--output-len", str(args.output_len),
           "--seed", str(args.seed), "--save-result", result_path, "--no-progress"]
    if mode == "throughput":
        cmd += ["--max-concurrency", str(args.max_concurrency)]
    else:
        cmd += ["--request-rate", str(args.request_rate), "--burstiness", str(args.burstiness)]
        if args.latency_max_concurrency:
            cmd += ["--max-concurrency", str(args.latency_max_concurrency)]
    cmd += shlex.split(args.bench_args)
    _note("$ " + " ".join(shlex.quote(c) for c in cmd))
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    sys.stderr.write(proc.stdout)
    if log is not None:
        log.write(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 1) or not os.path.exists(result_path):
        raise RuntimeError(f"iris-bench failed (status {proc.returncode}):\n{proc.stderr[-4000:]}")
    with open(result_path) as f:
        return json.load(f)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    # "--extra-server-args --flag=x" would read as two options: glue the value on.
    glued: List[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--extra-server-args", "--bench-args") and i + 1 < len(argv):
            glued.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            glued.append(argv[i])
            i += 1
    args = build_parser().parse_args(glued)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("throughput", "latency"):
            _note(f"ablation: unknown mode {m!r}")
            return 2
    suite_configs, columns, base_name = SUITES[args.suite]
    configs = [c.strip() for c in (args.configs or ",".join(suite_configs)).split(",") if c.strip()]
    for c in configs:
        if c not in suite_configs:
            _note(f"ablation: unknown configuration {c!r} of suite {args.suite} (known: {', '.join(suite_configs)})")
            return 2
    if not os.path.isfile(args.server_bin):
        _note(f"ablation: no iris-server at {args.server_bin} (build it: cmake --build build "
              f"--target iris-server, or pass --server-bin)")
        return 2
    extra = shlex.split(args.extra_server_args) + passthrough
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="iris-ablation-") as tmp:
        for config in configs:
            if args.suite == "encoder":
                config_flags = server_flags(CONFIGS[config])
                want = {t: CONFIGS[config].get(t, True) for t in TECHNIQUES}
            else:
                config_flags = list(SCHEDULING_CONFIGS[config])
                want = {t: True for t in TECHNIQUES}
            flags = [f"--model={args.model}", f"--dtype={args.dtype}"] + config_flags + extra
            for mode in modes:
                # A fresh server per run: the encoder cache (keyed by image content) must not
                # carry one mode's images into the other's measurement.
                slug = f"{config.replace(' ', '-')}-{mode}"
                log = open(os.path.join(args.log_dir, f"{slug}.log"), "w") if args.log_dir else None
                try:
                    _note(f"== {config}, {mode} mode: {args.server_bin} {' '.join(flags)}")
                    server = IrisServer(args.server_bin, flags, startup_timeout_s=args.startup_timeout_s,
                                        log_file=log)
                    try:
                        server.start()
                    except ServerError as e:
                        _note(f"ablation: {e}")
                        return 1
                    try:
                        info = model_info(server.target)
                        if info["encoder_techniques"] != want:
                            _note(f"ablation: warning: the server reports {info['encoder_techniques']}, "
                                  f"expected {want}")
                        result = run_bench(args, server.target, mode, os.path.join(tmp, f"{slug}.json"), log)
                        if not args.keep_records:
                            result.pop("requests", None)
                        runs.append({"config": config, "mode": mode, "server_flags": flags,
                                     "server": info, "summary": result["summary"], "result": result})
                    finally:
                        status = server.stop()
                        if status not in (0, None):
                            _note(f"ablation: iris-server ({config}, {mode}) exited with status {status}")
                except RuntimeError as e:
                    _note(f"ablation: {e}")
                    return 1
                finally:
                    if log is not None:
                        log.close()
    for mode in modes:
        rows = [r for r in runs if r["mode"] == mode]
        if mode == "throughput":
            title = f"Throughput mode ({args.num_prompts} prompts, max concurrency {args.max_concurrency})"
        else:
            title = (f"Latency mode ({args.num_prompts} prompts, request rate {args.request_rate:g}/s, "
                     f"burstiness {args.burstiness:g}"
                     + (f", max concurrency {args.latency_max_concurrency}" if args.latency_max_concurrency else "")
                     + ")")
        print(f"### {title}\n")
        print(markdown_table(rows, base_name, columns))
    info = runs[0]["server"] if runs else {}
    print(f"Model {info.get('model', '?')} ({info.get('dtype', '?')}), output length {args.output_len}, "
          f"seed {args.seed}; client and server on {platform.node()} ({platform.machine()}, "
          f"{os.cpu_count()} CPUs). Changes are against \"{base_name}\".")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                       "args": vars(args), "server_passthrough": passthrough,
                       "machine": {"node": platform.node(), "machine": platform.machine(),
                                   "cpus": os.cpu_count(), "platform": platform.platform()},
                       "runs": runs}, f, indent=1)
            f.write("\n")
        _note(f"ablation: raw results written to {args.out}")
    return 0
