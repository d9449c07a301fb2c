"""A progress bar on stderr, drawn by hand: requests done of planned, and the stage running.

On a terminal the bar redraws in place (at most ten times a second); into a file or a pipe
it writes one line per stage and one at every tenth of the way, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    """Counts requests against a planned total; the total may be revised as stages learn."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stage = ""
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._drawn_at = 0.0
        self._tenth = -1

    def start(self, stage: str) -> None:
        """A stage begins."""
        self.stage = stage
        self._draw(force=True)

    def advance(self, count: int = 1) -> None:
        """``count`` more requests finished."""
        self.done += count
        self.total = max(self.total, self.done)
        self._draw()

    def revise(self, total: int) -> None:
        """A new planned total (never below what is done)."""
        self.total = max(total, self.done, 1)
        self._draw()

    def close(self) -> None:
        """Finish the line."""
        self._draw(force=True)
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()

    def line(self) -> str:
        """The bar as text."""
        share = min(self.done / self.total, 1.0)
        filled = round(share * WIDTH)
        bar = "#" * filled + "-" * (WIDTH - filled)
        return f"cachetest [{bar}] {self.done}/{self.total} {share:4.0%} {self.stage}"

    def _draw(self, *, force: bool = False) -> None:
        if self._tty:
            now = time.monotonic()
            if force or now - self._drawn_at >= 0.1:
                self._drawn_at = now
                self._stream.write("\r" + self.line().ljust(WIDTH + 40))
                self._stream.flush()
            return
        tenth = int(10 * min(self.done / self.total, 1.0))
        if force or tenth > self._tenth:
            self._tenth = tenth
            self._stream.write(self.line() + "\n")
            self._stream.flush()
