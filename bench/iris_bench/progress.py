"""A plain-text progress line on stderr, rewritten in place with a carriage return."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    """`update(ok)` after each finished request; `close()` ends the line. Redraws at most
    10 times a second (and always on the last request)."""

    def __init__(self, total: int, enabled: bool, label: str = "requests",
                 stream: Optional[TextIO] = None, width: int = 30):
        self.total = total
        self.enabled = enabled
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self.failed = 0
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False
        self._drawn_done = -1

    def update(self, ok: bool = True) -> None:
        self.done += 1
        if not ok:
            self.failed += 1
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.done >= self.total or now - self._last_draw >= 0.1:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        self._drawn_done = self.done
        elapsed = now - self.start
        frac = self.done / self.total if self.total else 1.0
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        mins, secs = divmod(int(elapsed), 60)
        text = (f"\r[{bar}] {self.done}/{self.total} {self.label} ({frac * 100:5.1f}%), "
                f"{self.failed} failed, {rate:.2f}/s, {mins:02d}:{secs:02d}")
        self.stream.write(text)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            if self._drawn_done != self.done:
                self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()
