"""The progress bar on stderr."""

from __future__ import annotations

import io

from gateway.tools.cachetest.progress import Progress


def test_the_progress_bar_writes_a_line_per_tenth_when_not_on_a_terminal() -> None:
    stream = io.StringIO()
    bar = Progress(20, stream)
    bar.start("cold-warm")
    for _ in range(20):
        bar.advance()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "cachetest [------------------------------] 0/20   0% cold-warm"
    assert lines[-1] == "cachetest [##############################] 20/20 100% cold-warm"
    assert len(lines) == 12  # the start, one at every tenth, and the close


def test_a_revised_total_never_falls_below_what_is_done() -> None:
    bar = Progress(100, io.StringIO())
    bar.advance(30)
    bar.revise(10)
    assert (bar.done, bar.total) == (30, 30)
    assert bar.line() == "cachetest [##############################] 30/30 100% "
