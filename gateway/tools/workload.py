"""A short built-in workload for the demo, sent through the gateway with the openai client.

Several tenants each run a few multi-turn chats that open with the same long system prompt
(so the prefix cache has something to hit, within each tenant's cache scope only), some of
them streamed. Each tenant also makes one mistake the way clients do: a request that
asks for more output than the model allows fails upstream, and the client retries it with
a sane limit under the same ``X-Interaction-Id``, so the failed attempt and its retry are
one interaction. A streamed request abandoned after its first chunk shows a cancellation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kvgate.workload")

SYSTEM = (
    "You are the support assistant of Northwind Outfitters, a shop for hiking and camping "
    "gear. Answer in two sentences at most, be friendly and precise, never invent stock "
    "levels or prices, and point customers to the returns page for anything about refunds. "
) * 12  # a few hundred tokens: many full KV blocks to reuse
QUESTIONS = (
    ("Do you ship to Norway?", "How long does it take?", "Can I track it?"),
    ("Which tent is best for two people?", "Is it waterproof?"),
    ("My boots are too small.", "Can I exchange them for a bigger size?"),
    ("Do you have gas canisters?", "Are they allowed on planes?", "What about ferries?"),
)
TOO_MANY_TOKENS = 1_000_000  # beyond any model's context: the upstream refuses it


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant the workload speaks for, with one of its API keys."""

    name: str
    key: str


@dataclass(frozen=True, slots=True)
class Outcome:
    completed: int
    failed: int
    cancelled: int


def _client(base_url: str, key: str) -> Any:
    from openai import OpenAI  # the demo's only use of the client: imported when it runs

    return OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)


def chat(base_url: str, tenant: Tenant, model: str, number: int) -> Outcome:
    """One conversation: every turn resends the history, as chat clients do."""
    import openai

    client = _client(base_url, tenant.key)
    interaction = f"{tenant.name}-chat-{number}"
    headers = {"X-Interaction-Id": interaction}
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    completed = failed = cancelled = 0
    for turn, question in enumerate(QUESTIONS[number % len(QUESTIONS)]):
        messages.append({"role": "user", "content": question})
        if number == 0 and turn == 0:
            try:  # the client's mistake, then its retry under the same interaction id
                client.chat.completions.create(
                    model=model,
                    messages=messages,
                    max_tokens=TOO_MANY_TOKENS,
                    extra_headers=headers,
                )
            except openai.BadRequestError:
                failed += 1
        if number % 2:
            stream = client.chat.completions.create(
                model=model, messages=messages, max_tokens=24, stream=True, extra_headers=headers
            )
            answer = "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )
        else:
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=24, extra_headers=headers
            )
            answer = reply.choices[0].message.content or ""
        completed += 1
        messages.append({"role": "assistant", "content": answer})
    if number == 1:
        stream = client.chat.completions.create(
            model=model,
            messages=[*messages, {"role": "user", "content": "Tell me more."}],
            max_tokens=200,
            stream=True,
            extra_headers={"X-Interaction-Id": f"{interaction}-x"},
        )
        next(iter(stream))
        stream.close()  # the user navigated away: the gateway records a cancellation
        cancelled += 1
    return Outcome(completed, failed, cancelled)


def run(
    base_url: str,
    tenants: Iterable[Tenant],
    model: str,
    *,
    chats_per_tenant: int = 4,
    concurrency: int = 8,
) -> Outcome:
    """Send the workload; returns what the client saw. Errors are logged, not raised."""
    jobs = [(tenant, number) for tenant in tenants for number in range(chats_per_tenant)]
    totals = Outcome(0, 0, 0)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(chat, base_url, tenant, model, number) for tenant, number in jobs]
        for future in futures:
            try:
                outcome = future.result()
            except Exception as exc:  # a demo aid: report and go on serving
                log.warning("demo workload request failed: %s", exc)
                continue
            totals = Outcome(
                totals.completed + outcome.completed,
                totals.failed + outcome.failed,
                totals.cancelled + outcome.cancelled,
            )
    return totals
