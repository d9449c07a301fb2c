"""A tiny hand-made trace (blocks of 4 tokens) whose numbers are worked out in the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tools.replay.trace import TraceRequest

TINY = (
    # t (ms), prompt, output, hash ids
    (0, 8, 1, (1, 2)),
    (1000, 12, 1, (1, 2, 3)),
    (1000, 8, 1, (7, 8)),
    (2000, 16, 1, (1, 2, 3, 4)),
)

SHARED_TRACE = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "traces"
    / "mooncake_conversation_first30min.jsonl"
)


@pytest.fixture
def tiny() -> list[TraceRequest]:
    return [TraceRequest(t, n, o, ids) for t, n, o, ids in TINY]


@pytest.fixture
def tiny_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text(
        "".join(
            f'{{"timestamp": {t}, "input_length": {n}, "output_length": {o}, '
            f'"hash_ids": {list(ids)}}}\n'
            for t, n, o, ids in TINY
        )
    )
    return path
