"""A one-line progress display on stderr (a bar on a terminal, sparse lines in a log)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, stream=None, width: int = 30):
        self.label, self.total, self.width = label, max(total, 1), width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_line = -1

    def update(self, done: int) -> None:
        frac = min(done / self.total, 1.0)
        elapsed = time.perf_counter() - self.start
        if self.tty:
            bar = "#" * int(frac * self.width)
            self.stream.write(f"\r{self.label:<14} [{bar:<{self.width}}] {done}/{self.total} "
                              f"{elapsed:6.1f}s")
            if done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
        else:  # logs get a line per quarter, not a carriage-return soup
            quarter = int(frac * 4)
            if quarter > self._last_line:
                self._last_line = quarter
                self.stream.write(f"{self.label}: {done}/{self.total} ({elapsed:.1f}s)\n")
                self.stream.flush()

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = max(total, 1)
        self.update(done)
