"""Prompt → salted block-hash chains: prefix-preserving, salted, stable."""

from __future__ import annotations

import xxhash

from gateway.routing.blocks import (
    DEFAULT_CHUNK_CHARS,
    TextHasher,
    render_chat,
    root_hash,
    text_block_hashes,
    token_block_hashes,
)


def test_only_full_chunks_are_hashed() -> None:
    assert len(text_block_hashes("x" * 130, chunk_chars=64, root=1)) == 2
    assert list(text_block_hashes("x" * 63, chunk_chars=64, root=1)) == []


def test_a_prompt_that_extends_another_keeps_its_hashes() -> None:
    base = "You are a helpful assistant. " * 20
    short = text_block_hashes(base, chunk_chars=64, root=7)
    longer = text_block_hashes(base + "And now a follow-up question?" * 9, chunk_chars=64, root=7)
    assert len(short) == len(base) // 64 == 9
    assert longer[: len(short)] == short
    assert len(longer) > len(short)


def test_a_change_in_one_chunk_changes_every_later_hash() -> None:
    text = "a" * 64 * 4
    changed = "a" * 64 + "b" + "a" * (64 * 3 - 1)
    left = text_block_hashes(text, chunk_chars=64, root=3)
    right = text_block_hashes(changed, chunk_chars=64, root=3)
    assert left[0] == right[0]
    assert all(a != b for a, b in zip(left[1:], right[1:], strict=True))


def test_salt_and_model_separate_every_block() -> None:
    text = "shared system prompt " * 40
    tenant_a = text_block_hashes(text, chunk_chars=64, root=root_hash("llama", "tenant-a"))
    tenant_b = text_block_hashes(text, chunk_chars=64, root=root_hash("llama", "tenant-b"))
    other_model = text_block_hashes(text, chunk_chars=64, root=root_hash("qwen", "tenant-a"))
    assert not set(tenant_a) & set(tenant_b)
    assert not set(tenant_a) & set(other_model)


def test_root_hash_is_stable_and_length_prefixed() -> None:
    assert root_hash("llama", "t") == root_hash("llama", "t")
    assert root_hash("ab", "c") != root_hash("a", "bc")
    assert root_hash("m", "") != root_hash("", "m")
    # Pinned: routing keys must not change between releases (a rolling restart would
    # otherwise forget every replica's cache at once).
    assert root_hash("llama", "t") == xxhash.xxh3_64_intdigest(b"5:llama1:t")


def test_text_hasher_is_the_text_mode_seam() -> None:
    hasher = TextHasher()
    assert hasher.chunk_chars == DEFAULT_CHUNK_CHARS == 64
    assert hasher.block_tokens == 16
    assert hasher.hashes("z" * 200, root=5) == text_block_hashes("z" * 200, chunk_chars=64, root=5)


def test_token_blocks_are_prefix_preserving_and_full_only() -> None:
    tokens = list(range(1000, 1050))
    head = token_block_hashes(tokens[:32], block_tokens=16, root=9)
    whole = token_block_hashes(tokens, block_tokens=16, root=9)
    assert len(head) == 2
    assert len(whole) == 3
    assert whole[:2] == head


def test_render_chat_string_and_text_parts_render_alike() -> None:
    plain = [{"role": "user", "content": "hello world"}]
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}],
        }
    ]
    assert render_chat(plain) == render_chat(parts) == "user\x1fhello world\x1e"


def test_render_chat_is_prefix_preserving_as_a_conversation_grows() -> None:
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    grown = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert render_chat(grown).startswith(render_chat(first))


def test_render_chat_keeps_names_tools_and_other_parts_stably() -> None:
    messages = [
        {
            "role": "user",
            "name": "ann",
            "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "low"}}],
        },
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    ]
    assert render_chat(messages) == (
        'user\x1fann\x1f{"image_url":{"detail":"low","url":"u"},"type":"image_url"}\x1e'
        'assistant\x1f\x1f[{"id":"c1","type":"function"}]\x1e'
    )
