"""The gateway names a prompt's blocks exactly as the replica does: the same tokens
(chat template applied as the replica applies it) and the same salted block hashes as
the replica's own KV events announce, for several shapes of chat and for completions."""

from __future__ import annotations

from typing import Any

import openai

from gateway.api.calls import Call, Endpoint
from gateway.routing.kv_wire import BlockStored, decode_batch
from gateway.routing.load import CacheConfig
from gateway.routing.prompts import Prompt, PromptHasher
from gateway.serving.fleets import prompt_tokenizer
from gateway.serving.prompts import routing_prompt
from tests.support.vllm import BLOCK_SIZE, SERVED_NAME
from tests.vllm.conftest import ExactStack
from tests.vllm.replicas import replay_all, replica_tokens, text

UNICODE = "Unicode: ünïcödé, 日本語, emoji 🙂 "
CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello there, " + text(11, 50)}]},
    {
        "messages": [
            {"role": "system", "content": text(12, 80)},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "part one"},
                    {"type": "text", "text": text(13, 40)},
                ],
            },
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Why? " + text(14, 30)},
            {"role": "assistant", "content": "Because " + text(15, 30)},
            {"role": "user", "content": "And then? " + text(16, 30)},
        ]
    },
    {"messages": [{"role": "user", "content": UNICODE + text(17, 40)}]},
]
PROMPT = "A completion prompt: " + text(18, 90)


class Hasher:
    """The gateway's hashing of a call: the serving path's prompt, routing's hasher."""

    def __init__(self, stack: ExactStack) -> None:
        tokenizer = prompt_tokenizer(stack.backend.tokenizer)  # the sim's, or the tiny model's
        self.hasher = PromptHasher(
            model=SERVED_NAME, block_size=BLOCK_SIZE, tokenizer=tokenizer, configured=False
        )
        self.hasher.configure(CacheConfig(block_size=BLOCK_SIZE, hash_algo="sha256"))

    def prompt(self, call: Call, salt: str) -> Prompt:
        return self.hasher.prompt(routing_prompt(call), salt)


def hasher(stack: ExactStack) -> Hasher:
    return Hasher(stack)


def call(endpoint: Endpoint, body: dict[str, Any]) -> Call:
    return Call(
        endpoint=endpoint,
        model=SERVED_NAME,
        body=body,
        stream=False,
        client_wants_usage=False,
        client_salt=None,
        interaction_hint=None,
        prompt_chars=0,
    )


def test_prompt_tokens_are_the_replicas_own(stack: ExactStack) -> None:
    replica = stack.backend.replicas[0].url
    prompts = hasher(stack)
    for body in CHATS:
        assert prompts.prompt(call(Endpoint.CHAT, body), "").prompt_tokens == len(
            replica_tokens(replica, body["messages"])
        )
    completion = prompts.prompt(call(Endpoint.COMPLETIONS, {"prompt": PROMPT}), "")
    assert completion.prompt_tokens == len(replica_tokens(replica, prompt=PROMPT))


def test_salted_block_hashes_are_the_ones_the_replica_announces(stack: ExactStack) -> None:
    replica = stack.backend.replicas[0]
    prompts = hasher(stack)
    api = openai.OpenAI(base_url=replica.url + "/v1", api_key="unused", max_retries=0)
    expected: list[int] = []
    for n, body in enumerate(CHATS):
        salt = f"tenant-salt-{n}"
        api.chat.completions.create(
            model=SERVED_NAME, max_tokens=1, temperature=0, extra_body={"cache_salt": salt}, **body
        )
        expected += prompts.prompt(call(Endpoint.CHAT, body), salt).hashes
    api.completions.create(
        model=SERVED_NAME,
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        extra_body={"cache_salt": "tenant-salt-c"},
    )
    expected += prompts.prompt(
        call(Endpoint.COMPLETIONS, {"prompt": PROMPT}), "tenant-salt-c"
    ).hashes
    announced = {
        block
        for _, payload in replay_all(replica.replay_endpoint)
        for event in decode_batch(payload).events
        if isinstance(event, BlockStored)
        for block in event.block_hashes
    }
    assert len(expected) >= 8
    assert set(expected) <= announced
