"""Other wires on hosted targets that speak only OpenAI's chat, translated with litellm
(gateway/upstream/adapters.py): the hosted backend's third way.

    /v1/messages    Anthropic's Messages (gateway/serving/translated_messages.py)
    /v1/responses   OpenAI's Responses (gateway/serving/translated_responses.py)

Each request is turned into chat, then sent as any chat to that target is: over its own
OpenAI wire (chatwire.py) or through litellm's completion. The answer, or the stream's
chunks as they come, are turned back into the client's wire.

The usage billed is the chat call's, read in the provider's own convention, so a
translated request costs exactly what the same chat to the same target does; the client
sees it in its wire's convention. A failure before the answer fails over like chat's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from gateway.config import ProviderTarget
from gateway.serving.backend import Answer, UpstreamEvents
from gateway.serving.calls import Call, Endpoint
from gateway.serving.translated_messages import MessagesDialect
from gateway.serving.translated_responses import ResponsesDialect
from gateway.serving.translated_stream import TranslatedStream
from gateway.upstream.adapters import MessagesAdapter, ResponsesAdapter
from gateway.upstream.providers import ProviderFailure, Providers

__all__ = ["TranslatedStream", "Translation"]

log = logging.getLogger("kvgate.providers")
Reply = TypeVar("Reply")


class Dialect(Protocol):
    """One wire as chat and back; ``state`` is what the request leaves for the answer."""

    def to_chat(
        self, body: Mapping[str, Any], target: ProviderTarget
    ) -> tuple[dict[str, Any], Any]:
        """The client's body as chat for ``target``, and the state for the way back."""
        ...

    def answer(self, chat: Answer, state: Any) -> Answer:
        """The chat answer in the client's wire, billed as the chat was."""
        ...

    def stream(self, chat: UpstreamEvents, target: ProviderTarget, state: Any) -> TranslatedStream:
        """The chat stream as the client's wire's events."""
        ...


class Translation:
    """Messages and Responses over chat for the hosted backend; litellm is loaded at its
    first use."""

    def __init__(self, providers: Providers) -> None:
        self.providers = providers
        self.dialects: dict[Endpoint, Dialect] = {
            Endpoint.MESSAGES: MessagesDialect(MessagesAdapter(providers)),
            Endpoint.RESPONSES: ResponsesDialect(ResponsesAdapter(providers)),
        }
        self._loading = asyncio.Lock()
        self._loaded = False

    async def ready(self) -> None:
        """litellm loaded (seconds, once: off the loop, before the first translation)."""
        if self._loaded:
            return
        async with self._loading:
            if not self._loaded:
                try:
                    await asyncio.to_thread(self.providers.load)
                except ImportError as exc:  # kvgate without its providers extra
                    raise ProviderFailure(
                        f"this request is translated for this model by litellm, which is "
                        f"not installed (pip install 'kvgate[providers]'): {exc}",
                        status=None,
                        retryable=True,  # a later target may speak the wire itself
                    ) from exc
                self._loaded = True
                log.info("litellm %s loaded to translate requests", self.providers.version)

    async def _ask(
        self,
        call: Call,
        target: ProviderTarget,
        chat: Callable[[Call, ProviderTarget], Awaitable[Reply]],
    ) -> tuple[Reply, Dialect, Any]:
        """The call sent as chat to ``target``: the chat's reply, its dialect and state."""
        await self.ready()
        dialect = self.dialects[call.endpoint]
        body, state = dialect.to_chat(call.body, target)
        # The client's wire headers (Anthropic's version, betas) mean nothing to chat.
        asked = replace(call, endpoint=Endpoint.CHAT, body=body, wire_headers=())
        return await chat(asked, target), dialect, state

    async def send(
        self,
        call: Call,
        target: ProviderTarget,
        chat: Callable[[Call, ProviderTarget], Awaitable[Answer]],
    ) -> Answer:
        """One chat call, its answer in the call's wire; billed as the chat was."""
        answer, dialect, state = await self._ask(call, target, chat)
        return dialect.answer(answer, state)

    async def open(
        self,
        call: Call,
        target: ProviderTarget,
        chat: Callable[[Call, ProviderTarget], Awaitable[UpstreamEvents]],
    ) -> TranslatedStream:
        """One chat stream, open (it fails over until then), its events in the call's wire."""
        stream, dialect, state = await self._ask(call, target, chat)
        return dialect.stream(stream, target, state)
