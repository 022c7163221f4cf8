"""Issues the requests: arrival times (throughput: all at once; latency: gamma-distributed
gaps), the concurrency cap, warmup, and the per-request records."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import List, Optional, Sequence

import numpy as np

from .metrics import RequestRecord
from .progress import Progress


def arrival_offsets(n: int, request_rate: float, burstiness: float, seed: int) -> List[float]:
    """Send times (s after the start) of `n` requests. Infinite rate: all at 0. Otherwise
    the gaps are gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness 1 = Poisson),
    accumulated, then scaled so the last one lands at n/rate exactly, as vLLM does."""
    if n <= 0:
        return []
    if request_rate == float("inf"):
        return [0.0] * n
    if request_rate <= 0:
        raise ValueError("the request rate must be positive")
    if burstiness <= 0:
        raise ValueError("burstiness must be positive")
    if burstiness == float("inf"):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        rng = np.random.default_rng([int(seed), 0x5eed])
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    offsets = np.cumsum(gaps)
    if offsets[-1] > 0:
        offsets *= (n / request_rate) / offsets[-1]
    return [float(x) for x in offsets]


async def _send_one(backend, payload, index: int, bench_start: float) -> RequestRecord:
    record = RequestRecord(index=index)
    await backend.send(payload, record, bench_start)
    return record


async def run_requests(backend, payloads: Sequence, offsets: Sequence[float],
                       max_concurrency: Optional[int], progress: Optional[Progress] = None):
    """Sends payloads[i] at offsets[i] (capped at max_concurrency in flight); returns the
    records (in payload order) and the benchmark duration in seconds."""
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    bench_start = time.perf_counter()
    if progress is not None:
        progress.start = bench_start

    async def limited(i, payload):
        async with semaphore:
            record = await _send_one(backend, payload, i, bench_start)
        if progress is not None:
            progress.update(record.success)
        return record

    tasks = []
    try:
        for i, payload in enumerate(payloads):
            delay = bench_start + offsets[i] - time.perf_counter()
            if offsets[i] > 0 and delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(limited(i, payload)))
        records = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    duration = time.perf_counter() - bench_start
    return list(records), duration


async def warmup(backend, payloads: Sequence, max_concurrency: Optional[int]) -> List[RequestRecord]:
    """Sends the warmup payloads (not measured); returns their records."""
    if not payloads:
        return []
    records, _ = await run_requests(backend, payloads, [0.0] * len(payloads), max_concurrency)
    return records
