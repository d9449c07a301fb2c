"""Other wires as chat and back, with litellm's own translations: the hosted targets whose
provider speaks only OpenAI's chat still serve Anthropic's Messages and OpenAI's Responses
(gateway/serving/translated.py sends the chat itself, as any chat to that target).

    MessagesAdapter    litellm's ``AnthropicAdapter``: a Messages body as chat, the chat
                       answer as a Message, the chat chunks as Anthropic's events
    ResponsesAdapter   litellm's Responses bridge (``litellm.responses.
                       litellm_completion_transformation``): a Responses body as chat, the
                       chat answer as a Response, the chat chunks as Responses events

litellm is imported by ``Providers.load`` (off the event loop, once) before either runs;
a body litellm cannot translate is a 400.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import ProviderTarget
from gateway.errors import InvalidRequest
from gateway.upstream.chatbody import dump
from gateway.upstream.providers import Providers

# Members of a Responses body that are not the request's parameters: the model (the
# target's), the input (translated apart), kvgate's salt, and what the chat call decides.
NOT_PARAMETERS = frozenset({"model", "input", "cache_salt", "stream", "stream_options"})


def _refusal(what: str, exc: Exception) -> InvalidRequest:
    said = " ".join(str(exc).split())[:300]
    return InvalidRequest(f"cannot translate this {what} request: {said}")


class MessagesAdapter:
    """Anthropic's Messages as chat, with litellm's ``AnthropicAdapter``."""

    def __init__(self, providers: Providers) -> None:
        self.providers = providers

    def to_chat(
        self, body: Mapping[str, Any], target: ProviderTarget
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A Messages body as a chat body for ``target``, and the tool names litellm shortened
        (OpenAI allows 64 characters); a body litellm cannot translate is a 400."""
        self.providers.load()
        from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

        request = {k: v for k, v in body.items() if k not in ("cache_salt", "metadata")}
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and "user_id" in metadata:
            # Anthropic's end user becomes chat's ``user``; the rest is kvgate's or litellm's.
            request["metadata"] = {"user_id": metadata["user_id"]}
        request["model"] = target.litellm_model
        try:
            chat, names = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
                request, custom_llm_provider=target.provider, api_base=target.base_url
            )
        except Exception as exc:  # litellm's checks raise ValueError, pydantic's, its own...
            raise _refusal("Messages", exc) from None
        if chat is None:
            raise InvalidRequest("cannot translate this Messages request")
        return dict(chat), dict(names)

    def to_message(
        self, body: Mapping[str, Any], usage: Mapping[str, Any] | None, names: dict[str, str]
    ) -> dict[str, Any]:
        """A chat answer (its usage beside it) as Anthropic's Messages answer."""
        self.providers.load()
        from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter
        from litellm.types.utils import ModelResponse

        response = ModelResponse(**{**body, "usage": dict(usage or {})})
        message = AnthropicAdapter().translate_completion_output_params(
            response, tool_name_mapping=names
        )
        return dump(message)

    def to_events(
        self, chunks: AsyncIterator[dict[str, Any]], model: str, names: dict[str, str]
    ) -> AsyncIterator[bytes]:
        """A chat stream's chunks as Anthropic's Messages events (message_start ...
        message_stop); a chunk source that raises ends them with an ``event: error``."""
        self.providers.load()
        from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter
        from litellm.types.utils import ModelResponseStream

        async def models() -> AsyncIterator[Any]:
            async for chunk in chunks:
                yield ModelResponseStream(**chunk)

        events = AnthropicAdapter().translate_completion_output_params_streaming(
            models(), model=model, tool_name_mapping=names, is_async=True
        )
        assert events is not None and hasattr(events, "__anext__")
        return events  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class ResponsesAsked:
    """What a chat answer is turned back into a Response with: the request's input and
    parameters (echoed in the Response), the target's model and provider."""

    input: Any
    parameters: dict[str, Any]
    model: str
    provider: str


class _ChatChunks:
    """Chat chunks as litellm's Responses iterator reads its CustomStreamWrapper: one
    ``ModelResponseStream`` at a time, no logging of litellm's own."""

    logging_obj = None

    def __init__(self, chunks: AsyncIterator[dict[str, Any]], model_of: Any) -> None:
        self.chunks = chunks
        self.model_of = model_of

    def __aiter__(self) -> _ChatChunks:
        return self

    async def __anext__(self) -> Any:
        return self.model_of(**(await self.chunks.__anext__()))

    async def aclose(self) -> None:
        closer = getattr(self.chunks, "aclose", None)
        if closer is not None:
            await closer()


class ResponsesAdapter:
    """OpenAI's Responses as chat, with litellm's Responses-to-completion bridge."""

    def __init__(self, providers: Providers) -> None:
        self.providers = providers

    def to_chat(
        self, body: Mapping[str, Any], target: ProviderTarget
    ) -> tuple[dict[str, Any], ResponsesAsked]:
        """A Responses body as a chat body for ``target``, and what turns the answer back."""
        self.providers.load()
        from litellm.responses.litellm_completion_transformation.transformation import (
            LiteLLMCompletionResponsesConfig,
        )

        parameters = {k: v for k, v in body.items() if k not in NOT_PARAMETERS}
        metadata = parameters.get("metadata")
        if isinstance(metadata, dict) and "interaction_id" in metadata:
            rest = {k: v for k, v in metadata.items() if k != "interaction_id"}
            parameters["metadata"] = rest or None
        bridge = LiteLLMCompletionResponsesConfig
        # Nothing is stored where the chat goes: the Response says so.
        parameters["store"] = False
        asked = ResponsesAsked(
            input=body["input"],
            parameters={k: v for k, v in parameters.items() if v is not None},
            model=target.provider_model,
            provider=target.provider,
        )
        try:
            chat = bridge.transform_responses_api_request_to_chat_completion_request(
                model=target.provider_model,
                input=asked.input,
                responses_api_request=asked.parameters,  # type: ignore[arg-type]
                custom_llm_provider=target.provider,
                stream=None,
            )
        except Exception as exc:  # litellm's checks raise ValueError, pydantic's, its own...
            raise _refusal("Responses", exc) from None
        return dict(chat), asked

    def to_response(
        self, body: Mapping[str, Any], usage: Mapping[str, Any] | None, asked: ResponsesAsked
    ) -> dict[str, Any]:
        """A chat answer (its usage beside it) as a Response."""
        self.providers.load()
        from litellm.responses.litellm_completion_transformation.transformation import (
            LiteLLMCompletionResponsesConfig,
        )
        from litellm.types.utils import ModelResponse

        response = ModelResponse(**{**body, "usage": dict(usage or {})})
        bridge = LiteLLMCompletionResponsesConfig
        translated = bridge.transform_chat_completion_response_to_responses_api_response(
            request_input=asked.input,
            chat_completion_response=response,
            responses_api_request=asked.parameters,  # type: ignore[arg-type]
        )
        return dump(translated)

    def to_events(
        self, chunks: AsyncIterator[dict[str, Any]], asked: ResponsesAsked
    ) -> AsyncIterator[dict[str, Any]]:
        """A chat stream's chunks as Responses events (response.created ...
        response.completed), each as its JSON object; a chunk source that raises raises."""
        self.providers.load()
        from litellm.responses.litellm_completion_transformation.streaming_iterator import (
            LiteLLMCompletionStreamingIterator,
        )
        from litellm.types.utils import ModelResponseStream

        events = LiteLLMCompletionStreamingIterator(
            model=asked.model,
            litellm_custom_stream_wrapper=_ChatChunks(chunks, ModelResponseStream),
            request_input=asked.input,
            responses_api_request=asked.parameters,  # type: ignore[arg-type]
            custom_llm_provider=asked.provider,
        )

        async def dumped() -> AsyncIterator[dict[str, Any]]:
            try:
                async for event in events:
                    yield dump(event)
            finally:
                await events.aclose()

        return dumped()
