"""Issues the requests: arrival times (throughput: all at once; latency: gamma-distributed
gaps), the concurrency cap, warmup, and the per-request records."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Callable, List, Optional, Sequence

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


@dataclasses.dataclass
class Conversation:
    """A two-turn chat: `first` is sent; when it succeeds, `follow_up(reply text)` makes the
    second turn's payload (turn 1's messages, the reply, a new question), sent at once. Both
    turns hold one concurrency slot between them, as one user's chat would."""

    first: Any
    follow_up: Callable[[str], Any]


async def _send_one(backend, payload, index: int, bench_start: float, turn: int = 1) -> RequestRecord:
    record = RequestRecord(index=index, turn=turn)
    await backend.send(payload, record, bench_start)
    return record


async def _send_unit(backend, payload, index: int, bench_start: float,
                     progress: Optional[Progress]) -> List[RequestRecord]:
    """The records of one payload: one request, or both turns of a Conversation (the second
    one failed and unsent when the first failed)."""
    if not isinstance(payload, Conversation):
        records = [await _send_one(backend, payload, index, bench_start)]
    else:
        first = await _send_one(backend, payload.first, index, bench_start, turn=1)
        if progress is not None:
            progress.update(first.success)
        if first.success:
            second = await _send_one(backend, payload.follow_up(first.generated_text), index,
                                     bench_start, turn=2)
        else:
            second = RequestRecord(index=index, turn=2, request_id=first.request_id + "-turn2",
                                   error="not sent: turn 1 failed")
        records = [first, second]
    if progress is not None:
        progress.update(records[-1].success)
    return records


def units(payloads: Sequence) -> int:
    """Requests the payloads make (a Conversation makes two)."""
    return sum(2 if isinstance(p, Conversation) else 1 for p in payloads)


async def run_requests(backend, payloads: Sequence, offsets: Sequence[float],
                       max_concurrency: Optional[int], progress: Optional[Progress] = None):
    """Sends payloads[i] at offsets[i] (capped at max_concurrency in flight); returns the
    records (in payload order; a Conversation gives its two turns' records) and the benchmark
    duration in seconds."""
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    bench_start = time.perf_counter()
    if progress is not None:
        progress.start = bench_start

    async def limited(i, payload):
        async with semaphore:
            return await _send_unit(backend, payload, i, bench_start, progress)

    tasks = []
    try:
        for i, payload in enumerate(payloads):
            delay = bench_start + offsets[i] - time.perf_counter()
            if offsets[i] > 0 and delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(limited(i, payload)))
        per_payload = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    duration = time.perf_counter() - bench_start
    return [r for records in per_payload for r in records], duration


async def warmup(backend, payloads: Sequence, max_concurrency: Optional[int]) -> List[RequestRecord]:
    """Sends the warmup payloads (not measured); returns their records."""
    if not payloads:
        return []
    records, _ = await run_requests(backend, payloads, [0.0] * len(payloads), max_concurrency)
    return records
