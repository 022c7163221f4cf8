"""iris-bench: the serving benchmark (command line). See bench/iris-bench --help."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import socket
import sys
import time
from typing import List, Optional

from . import datasets, metrics, runner, sweep
from .progress import Progress

VERSION = "1"
DEFAULT_NUM_PROMPTS = 500


class UsageError(Exception):
    pass


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {v}")
    return v


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _nonneg_int(text: str) -> int:
    return _int_at_least(text, 0)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _nonneg_float(text: str) -> float:
    v = _float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _unit_interval(text: str) -> float:
    v = _float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return v


def _percentiles(text: str) -> List[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            p = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a percentile: {part!r}") from None
        if not 0 <= p <= 100:
            raise argparse.ArgumentTypeError(f"percentiles are in [0, 100], got {part}")
        out.append(p)
    return out


def _metric_names(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in ("ttft", "tpot", "itl", "e2el"):
            raise argparse.ArgumentTypeError(f"unknown metric {n!r} (ttft, tpot, itl, e2el)")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="iris-bench",
        description="Serving benchmark for iris (gRPC) and OpenAI-compatible chat servers, with "
                    "the metrics of `vllm bench serve`. The report goes to stdout; progress and "
                    "notes go to stderr.",
        epilog="Examples:\n"
               "  iris-bench --target 127.0.0.1:50051 --mode throughput --num-prompts 500 --max-concurrency 16\n"
               "  iris-bench --target 127.0.0.1:50051 --mode latency --num-prompts 500 --request-rate 10 --burstiness 5\n"
               "  iris-bench sweep --target 127.0.0.1:50051 --concurrency 1,2,4,8,16 --num-prompts 64 \\\n"
               "             --result-json sweep.json --plot-dir sweep-plots\n"
               "  iris-bench --target 127.0.0.1:50051 --dataset multiturn --num-prompts 16 --max-concurrency 4\n"
               "  iris-bench --backend openai-chat --target 127.0.0.1:8000 --model Qwen/Qwen2.5-VL-3B-Instruct \\\n"
               "             --mode throughput --num-prompts 200 --max-concurrency 16 --save-result vllm.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("grpc", "openai-chat"), default="grpc",
                   help="grpc: the iris Generate RPC; openai-chat: POST chat completions with SSE (default grpc)")
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--model", help="model name for openai-chat (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", default="/v1/chat/completions", help="openai-chat path (default %(default)s)")
    p.add_argument("command", nargs="?", choices=("sweep",),
                   help="`sweep` is short for --mode sweep")
    p.add_argument("--mode", choices=("throughput", "latency", "sweep"),
                   help="throughput: every request at once, limited by --max-concurrency; latency: "
                        "requests arrive at --request-rate; sweep: throughput mode at each level "
                        "of --concurrency, --num-prompts requests each (`iris-bench sweep ...` is "
                        "`--mode sweep`; default throughput)")
    p.add_argument("--num-prompts", type=_positive_int,
                   help=f"requests to send (default {DEFAULT_NUM_PROMPTS} synthetic; every line of a JSONL file)")
    p.add_argument("--max-concurrency", type=_positive_int, help="most requests in flight at once")
    p.add_argument("--concurrency", type=sweep.parse_concurrency_list, metavar="C1,C2,...",
                   help="sweep mode: the max-concurrency levels, strictly increasing (e.g. 1,2,4,8,16)")
    p.add_argument("--plot-dir", metavar="DIR",
                   help="sweep mode: write throughput.png, ttft.png and itl.png here")
    p.add_argument("--request-rate", type=_positive_float, help="latency mode: mean requests per second")
    p.add_argument("--burstiness", type=_positive_float, default=1.0,
                   help="latency mode: gamma shape of the arrival gaps; 1 = Poisson, higher = more even (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data and the arrival times (default 0)")
    p.add_argument("--dataset", choices=("synthetic", "multiturn", "jsonl"), default="synthetic",
                   help="synthetic: vision-arena-like images and questions; multiturn: the same, "
                        "each followed by a second turn that resends the image and the reply with a "
                        "new question (--num-prompts conversations, TTFT reported per turn); "
                        "jsonl: --dataset-path (default synthetic)")
    p.add_argument("--dataset-path", help="the JSONL file: {\"image\": path|null, \"prompt\": str, \"output_len\": int} per line")
    p.add_argument("--output-len", type=_positive_int, default=128,
                   help="output tokens per request (synthetic, and JSONL lines without output_len; default 128)")
    p.add_argument("--temperature", type=_nonneg_float, default=0.0,
                   help="sampling temperature of every request (default 0: greedy, picked on the device)")
    p.add_argument("--top-p", type=_unit_interval, default=1.0, help="nucleus sampling (default 1: off)")
    p.add_argument("--top-k", type=_nonneg_int, default=0, help="top-k sampling (default 0: off)")
    p.add_argument("--text-only-input-tokens", action="store_true",
                   help="count input tokens without the image tokens (default: all prompt tokens)")
    p.add_argument("--image-max-pixels", type=_nonneg_int, default=0,
                   help="grpc: the requests' Image.max_pixels (0 = not set)")
    p.add_argument("--save-result", "--result-json", dest="save_result", metavar="FILE.json",
                   help="write config, metrics and per-request records (sweep: every level's metrics)")
    p.add_argument("--token-file", help="file holding a bearer token for the Authorization header")
    p.add_argument("--tls-ca", help="PEM root certificates: connect with TLS (https for openai-chat)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show the progress line on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line")
    p.add_argument("--warmup", type=_nonneg_int, default=1,
                   help="unmeasured requests sent first, each must succeed (default 1)")
    p.add_argument("--timeout-s", type=_positive_float, default=3600.0,
                   help="per-request limit in seconds (default 3600)")
    p.add_argument("--percentiles", type=_percentiles, default=[99.0],
                   help="comma-separated percentiles to report (default 99)")
    p.add_argument("--percentile-metrics", type=_metric_names, default=["ttft", "tpot", "itl"],
                   help="comma-separated sections of ttft,tpot,itl,e2el (default ttft,tpot,itl)")
    p.add_argument("--request-id-prefix", default=None,
                   help="prefix of the request ids (default bench-<host>-<pid>-)")
    return p


def _check_args(args) -> None:
    if args.command == "sweep" and args.mode not in (None, "sweep"):
        raise UsageError(f"`iris-bench sweep` runs --mode sweep, not --mode {args.mode}")
    args.mode = args.mode or ("sweep" if args.command == "sweep" else "throughput")
    if args.mode == "sweep":
        if not args.concurrency:
            raise UsageError("--mode sweep needs --concurrency (a list such as 1,2,4,8)")
        if args.max_concurrency is not None:
            raise UsageError("--max-concurrency is not for --mode sweep (--concurrency lists the levels)")
        if args.request_rate is not None:
            raise UsageError("--request-rate is not for --mode sweep (each level runs in throughput mode)")
    else:
        if args.concurrency is not None:
            raise UsageError("--concurrency is for --mode sweep (`iris-bench sweep --concurrency 1,2,4`)")
        if args.plot_dir is not None:
            raise UsageError("--plot-dir is for --mode sweep")
    if args.mode == "latency" and args.request_rate is None:
        raise UsageError("--mode latency needs --request-rate")
    if args.mode == "throughput" and args.request_rate is not None:
        raise UsageError("--request-rate is for --mode latency (throughput mode sends at an infinite rate)")
    if args.dataset == "jsonl" and not args.dataset_path:
        raise UsageError("--dataset jsonl needs --dataset-path")
    if args.dataset != "jsonl" and args.dataset_path:
        raise UsageError("--dataset-path is for --dataset jsonl")
    if args.backend == "grpc" and args.model:
        raise UsageError("--model is for --backend openai-chat (the iris server serves one model)")


def _load_requests(args, level: int = 0) -> List[datasets.SampleRequest]:
    """The requests of a run (of sweep level `level`: synthetic indices level*N.., so that no
    level repeats an earlier level's images)."""
    if args.dataset == "jsonl":
        return datasets.jsonl_dataset(args.dataset_path, args.output_len, args.num_prompts)
    n = args.num_prompts or DEFAULT_NUM_PROMPTS
    if args.dataset == "multiturn":
        return datasets.multiturn_dataset(n, args.seed, args.output_len, start=level * n)
    return datasets.synthetic_dataset(n, args.seed, args.output_len, start=level * n)


def _payloads(backend, reqs, prefix: str) -> list:
    """Backend payloads of the requests; multi-turn ones become runner.Conversations."""
    out = []
    for i, r in enumerate(reqs):
        payload = backend.prepare(r, f"{prefix}{i}")
        if r.follow_up is not None:
            def follow_up(reply, r=r, rid=f"{prefix}{i}-turn2"):
                return backend.prepare_follow_up(r, rid, reply)
            payload = runner.Conversation(payload, follow_up)
        out.append(payload)
    return out


def _warmup_requests(args, reqs) -> List[datasets.SampleRequest]:
    """Warmup requests look like the first request but carry their own images, so that the
    measured requests find nothing of theirs in a server-side cache."""
    out = []
    first = reqs[0]
    for j in range(args.warmup):
        if first.image is None:
            out.append(datasets.SampleRequest(prompt=first.prompt, output_len=first.output_len))
            continue
        w = datasets.synthetic_request(args.seed, 1_000_000_000 + j, first.output_len)
        w.prompt = first.prompt
        out.append(w)
    return out


def _make_backend(args, token: Optional[str]):
    if args.backend == "grpc":
        from .grpc_backend import GrpcBackend
        ca = None
        if args.tls_ca:
            with open(args.tls_ca, "rb") as f:
                ca = f.read()
        return GrpcBackend(args.target, token=token, tls_ca=ca, timeout_s=args.timeout_s,
                           image_max_pixels=args.image_max_pixels, sampling=_sampling(args))
    from .openai_backend import OpenAIChatBackend
    if args.image_max_pixels:
        _note("iris-bench: note: --image-max-pixels applies to the grpc backend only (the OpenAI API has no "
              "per-image pixel bound); to compare the two, bound the server instead (iris-server --max-pixels)")
    return OpenAIChatBackend(args.target, endpoint=args.endpoint, model=args.model, token=token,
                             tls_ca=args.tls_ca, timeout_s=args.timeout_s, sampling=_sampling(args))


def _sampling(args) -> dict:
    """The sampling fields every request carries beside max_tokens and ignore_eos: temperature
    always (0 is greedy), top_p and top_k where they are on (with ignore_eos, a reply's length does
    not depend on what is drawn)."""
    out = {"temperature": args.temperature}
    if args.top_p < 1.0:
        out["top_p"] = args.top_p
    if args.top_k > 0:
        out["top_k"] = args.top_k
    return out


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _warmup(args, backend, warm_payloads, max_concurrency) -> None:
    if warm_payloads:
        _note(f"Warming up with {len(warm_payloads)} request(s)...")
        warm = await runner.warmup(backend, warm_payloads, max_concurrency)
        bad = [r for r in warm if not r.success]
        if bad:
            raise RuntimeError(f"warmup request failed: {bad[0].error} "
                               f"(is the server at {args.target} up and serving?)")


async def _run(args, backend, payloads, warm_payloads, offsets, progress):
    await backend.start()
    try:
        await _warmup(args, backend, warm_payloads, args.max_concurrency)
        _note("Starting the benchmark run...")
        return await runner.run_requests(backend, payloads, offsets, args.max_concurrency, progress)
    finally:
        await backend.close()


def _config(args, request_rate: float, reqs) -> dict:
    cfg = {k: v for k, v in vars(args).items() if k not in ("progress", "command")}
    cfg["request_rate"] = None if request_rate == float("inf") else request_rate
    cfg["num_prompts"] = len(reqs)
    cfg["iris_bench_version"] = VERSION
    cfg["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    cfg["client_host"] = platform.node()
    cfg["images"] = sum(1 for r in reqs if r.image is not None)
    cfg["image_bytes_total"] = sum(len(r.image) for r in reqs if r.image is not None)
    return cfg


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_args(args)
    except UsageError as e:
        parser.error(str(e))
    token = None
    if args.token_file:
        try:
            with open(args.token_file, "r", encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            _note(f"iris-bench: cannot read --token-file {args.token_file}: {e.strerror or e}")
            return 2
    try:
        t = time.perf_counter()
        reqs = _load_requests(args)
        warm = _warmup_requests(args, reqs)
        _note(f"Prepared {len(reqs)} {args.dataset} requests in {time.perf_counter() - t:.1f} s "
              f"({sum(1 for r in reqs if r.image is not None)} with an image).")
    except datasets.DatasetError as e:
        _note(f"iris-bench: {e}")
        return 2
    try:
        backend = _make_backend(args, token)
    except Exception as e:  # stubs missing, bad target, unreadable CA file
        _note(str(e) if str(e).startswith("iris-bench") else f"iris-bench: {e}")
        return 2
    prefix = args.request_id_prefix
    if prefix is None:
        prefix = f"bench-{socket.gethostname()[:32]}-{os.getpid()}-"
    warm_payloads = [backend.prepare(r, f"{prefix}warmup-{j}") for j, r in enumerate(warm)]
    if args.mode == "sweep":
        return _main_sweep(args, backend, reqs, warm_payloads, prefix)
    payloads = _payloads(backend, reqs, prefix)
    request_rate = float("inf") if args.mode == "throughput" else args.request_rate
    offsets = runner.arrival_offsets(len(payloads), request_rate, args.burstiness, args.seed)
    distribution = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
    _note(f"Backend {args.backend} at {args.target}, {args.mode} mode: request rate "
          f"{request_rate}, burstiness {args.burstiness:g} ({distribution}), maximum request "
          f"concurrency {args.max_concurrency}.")
    show = _show_progress(args)
    progress = Progress(runner.units(payloads), enabled=show)
    try:
        records, duration = asyncio.run(_run(args, backend, payloads, warm_payloads, offsets, progress))
    except KeyboardInterrupt:
        progress.close()
        _note("iris-bench: interrupted")
        return 130
    except Exception as e:
        progress.close()
        _note(f"iris-bench: {e}")
        return 2
    progress.close()
    for r in records:
        r.expected_output_len = r.expected_output_len or reqs[r.index].output_len
    m = metrics.compute_metrics(records, duration, args.text_only_input_tokens, args.percentiles)
    turns = metrics.turn_ttft_ms(records, args.percentiles)
    sys.stdout.write(metrics.format_report(
        m, max_concurrency=args.max_concurrency, request_rate=request_rate,
        percentiles=args.percentiles, percentile_metrics=args.percentile_metrics, turn_ttft=turns))
    errors = metrics.format_errors(records)
    if errors:
        sys.stdout.write(errors)
    sys.stdout.flush()
    if args.text_only_input_tokens and any(r.success and r.image_tokens_source == "estimated" for r in records):
        _note("iris-bench: note: the server reported no image tokens; text-only input tokens "
              "subtract Qwen2.5-VL estimates")
    if args.save_result:
        result = {
            "config": _config(args, request_rate, reqs),
            "summary": dict(m.to_json(), **({"turn_ttft_ms": {str(t): v for t, v in turns.items()}}
                                            if turns else {})),
            "errors": [{"error": e, "count": n} for e, n in metrics.error_counts(records)],
            "requests": [dict(r.to_json(), image_size=reqs[r.index].image_size,
                              image_bytes=len(reqs[r.index].image) if reqs[r.index].image else 0,
                              kind=reqs[r.index].kind)
                         for r in records],
        }
        try:
            with open(args.save_result, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        except OSError as e:
            _note(f"iris-bench: cannot write --save-result {args.save_result}: {e.strerror or e}")
            return 2
        _note(f"Results written to {args.save_result}")
    return 0 if m.completed > 0 else 1


def _show_progress(args) -> bool:
    return args.progress if args.progress is not None else sys.stderr.isatty()


async def _run_sweep(args, backend, first_reqs, warm_payloads, prefix) -> List[sweep.Level]:
    """Throughput mode at each level of --concurrency on one connection; prints each level's
    table row as it finishes."""
    percentiles = sorted(set(sweep.SWEEP_PERCENTILES) | set(args.percentiles))
    levels = []
    await backend.start()
    try:
        await _warmup(args, backend, warm_payloads, args.concurrency[0])
        sys.stdout.write(sweep.table_header())
        sys.stdout.flush()
        for j, c in enumerate(args.concurrency):
            reqs = first_reqs if j == 0 else _load_requests(args, level=j)  # made before timing
            payloads = _payloads(backend, reqs, f"{prefix}c{c}-")
            _note(f"Level {j + 1}/{len(args.concurrency)}: max concurrency {c}, "
                  f"{runner.units(payloads)} requests...")
            progress = Progress(runner.units(payloads), enabled=_show_progress(args))
            records, duration = await runner.run_requests(
                backend, payloads, [0.0] * len(payloads), c, progress)
            progress.close()
            for r in records:
                r.expected_output_len = r.expected_output_len or reqs[r.index].output_len
            level = sweep.Level(
                max_concurrency=c,
                metrics=metrics.compute_metrics(records, duration, args.text_only_input_tokens, percentiles),
                errors=[{"error": e, "count": n} for e, n in metrics.error_counts(records)],
                turn_ttft_ms=metrics.turn_ttft_ms(records, percentiles))
            levels.append(level)
            sys.stdout.write(sweep.table_row(level))
            sys.stdout.flush()
    finally:
        await backend.close()
    return levels


def _main_sweep(args, backend, reqs, warm_payloads, prefix) -> int:
    _note(f"Backend {args.backend} at {args.target}, sweep over max concurrency "
          f"{','.join(map(str, args.concurrency))}: {len(reqs)} {args.dataset} prompts per level, "
          f"throughput mode.")
    if args.dataset == "jsonl":
        _note("iris-bench: note: --dataset jsonl sends the same requests at every level; a "
              "server-side cache may serve later levels' images")
    try:
        levels = asyncio.run(_run_sweep(args, backend, reqs, warm_payloads, prefix))
    except KeyboardInterrupt:
        _note("iris-bench: interrupted")
        return 130
    except Exception as e:
        _note(f"iris-bench: {e}")
        return 2
    for level in levels:
        errors = "; ".join(f"{x['count']} x {x['error']}" for x in level.errors)
        if errors:
            _note(f"Errors at concurrency {level.max_concurrency}: {errors}")
    if args.save_result:
        result = {"config": _config(args, float("inf"), reqs),
                  "levels": [level.to_json() for level in levels]}
        try:
            with open(args.save_result, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        except OSError as e:
            _note(f"iris-bench: cannot write --result-json {args.save_result}: {e.strerror or e}")
            return 2
        _note(f"Results written to {args.save_result}")
    if args.plot_dir:
        title = f"{args.backend} {args.target}, {len(reqs)} {args.dataset} prompts per level"
        try:
            paths = sweep.write_plots(levels, args.plot_dir, title)
        except OSError as e:
            _note(f"iris-bench: cannot write --plot-dir {args.plot_dir}: {e.strerror or e}")
            return 2
        _note(f"Plots written: {', '.join(paths)}")
    return 0 if all(level.metrics.completed > 0 for level in levels) else 1
