"""What a stream has told the relay: output tokens counted for an estimate when the
stream ends before its usage chunk."""

from __future__ import annotations

from gateway.tools.sim.protocol import Reply
from gateway.upstream.sse import EventSplitter, StreamState, inspect


def counted(raw: bytes) -> int:
    state = StreamState()
    for event in EventSplitter().feed(raw):
        inspect(event, state)
    return state.content_events


def test_the_role_chunk_is_not_an_output_token() -> None:
    """vLLM opens a chat stream with a chunk naming the role, with empty content."""
    reply = Reply("chatcmpl-1", 0, "m", chat=True)
    for include_usage in (False, True):
        tokens = [reply.token_event(text, None, include_usage) for text in ("a", "b", "c")]
        assert counted(reply.role_event(include_usage) + b"".join(tokens)) == 3


def test_role_chunks_as_other_servers_write_them() -> None:
    assert counted(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n') == 0
    assert (
        counted(b'data: {"choices": [{"delta": {"role": "assistant", "content": null}}]}\n\n') == 0
    )
    # A role and a token in one chunk is a token; a token that reads "role" is a token.
    assert counted(b'data: {"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}\n\n') == 1
    assert counted(b'data: {"choices":[{"delta":{"content":"\\"role\\""}}]}\n\n') == 1
