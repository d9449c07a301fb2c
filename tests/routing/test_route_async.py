"""A long prompt's tokenizing and hashing runs off the event loop (Fleet.route_async)."""

from __future__ import annotations

import threading

from gateway.routing.fleet import OFF_LOOP_PROMPT_CHARS, Fleet
from gateway.routing.fleet_config import FleetConfig
from gateway.routing.inputs import ChatPrompt, PromptInput
from gateway.routing.prompts import Prompt
from gateway.routing.sim_tokenizer import SimTokenizer

REPLICAS = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")


def chat(text: str) -> ChatPrompt:
    return ChatPrompt([{"role": "user", "content": text}], chars=len(text))


async def test_a_long_prompt_is_hashed_in_a_thread_and_a_short_one_on_the_loop() -> None:
    config = FleetConfig(name="m", replicas=REPLICAS, tokenizer="kvgate-sim")
    fleet = Fleet(config, tokenizer=SimTokenizer())
    on_loop: list[bool] = []
    hash_prompt = fleet.hasher.prompt

    def watched(source: PromptInput, salt: str) -> Prompt:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return hash_prompt(source, salt)

    fleet.hasher.prompt = watched  # type: ignore[method-assign]
    short, long = chat("Say hi."), chat("A long document. " * (OFF_LOOP_PROMPT_CHARS // 10))
    assert long.chars > OFF_LOOP_PROMPT_CHARS
    routed = await fleet.route_async(short, cache_salt="s", request_id="r1", interaction_id="i")
    offloaded = await fleet.route_async(long, cache_salt="s", request_id="r2", interaction_id="i")
    assert on_loop == [True, False]
    # The same prompt, the same blocks, wherever they were computed.
    assert offloaded.prompt == hash_prompt(long, "s") and len(offloaded.prompt.hashes) > 100
    assert routed.prompt == hash_prompt(short, "s")


async def test_text_mode_stays_on_the_loop_whatever_the_length() -> None:
    fleet = Fleet(FleetConfig(name="m", replicas=REPLICAS))
    on_loop: list[bool] = []
    hash_prompt = fleet.hasher.prompt

    def watched(source: PromptInput, salt: str) -> Prompt:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return hash_prompt(source, salt)

    fleet.hasher.prompt = watched  # type: ignore[method-assign]
    await fleet.route_async(
        chat("x" * (OFF_LOOP_PROMPT_CHARS * 4)), cache_salt="s", request_id="r", interaction_id="i"
    )
    assert on_loop == [True]
