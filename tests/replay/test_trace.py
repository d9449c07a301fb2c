"""The Mooncake JSONL loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tools.replay.trace import TraceError, TraceRequest, load_trace


def test_it_loads_every_request_in_order(tiny_path: Path) -> None:
    requests = load_trace(tiny_path)
    assert requests[0] == TraceRequest(0, 8, 1, (1, 2))
    assert [r.timestamp_ms for r in requests] == [0, 1000, 1000, 2000]
    assert load_trace(tiny_path, limit=2) == requests[:2]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '\n{"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": [9]}\n\n'
    )
    assert load_trace(path) == [TraceRequest(5, 3, 2, (9,))]


def test_only_full_blocks_are_cacheable() -> None:
    request = TraceRequest(0, 1030, 5, (1, 2, 3))
    assert request.full_blocks() == 2
    assert request.cacheable() == (1, 2)
    assert request.cacheable(block_tokens=4) == (1, 2, 3)


def test_a_bad_line_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1}\n'
    )
    with pytest.raises(TraceError, match=r"bad.jsonl:2: not a Mooncake request"):
        load_trace(path)
    path.write_text('{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(TraceError, match="negative length"):
        load_trace(path)


def test_request_and_interaction_ids_are_read_when_a_trace_has_them(tmp_path: Path) -> None:
    path = tmp_path / "ids.jsonl"
    line = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]'
    path.write_text(
        f'{line}, "request_id": "req_1", "interaction_id": "chat-7"}}\n{line}}}\n'
        f'{line}, "request_id": 5}}\n'
    )
    with pytest.raises(TraceError, match=r"ids.jsonl:3: .*'request_id' must be a string"):
        load_trace(path)
    first, second = load_trace(path, limit=2)
    assert (first.request_id, first.interaction_id) == ("req_1", "chat-7")
    assert (second.request_id, second.interaction_id) == (None, None)
