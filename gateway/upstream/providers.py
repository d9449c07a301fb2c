"""Hosted providers through litellm: with gateway/upstream/adapters.py, the only modules
that import it, lazily, at first use.

litellm costs seconds to import and milliseconds of CPU per call, so it is loaded only when
a litellm deployment exists, and nothing on the vLLM path touches it. It runs offline and
quiet: its bundled price map and tokenizers only, no telemetry, no retries of its own (a
failed call is one recorded attempt; the next target is the gateway's choice), and its cost
figures are never read: kvgate prices usage with its own dated price book.

    complete      one chat completion, its usage normalised (``Reply``)
    open_stream   one streamed completion, its first chunk read
                  (gateway/upstream/provider_stream.py)

Errors are ``ProviderFailure`` (gateway/upstream/failures.py). What a chat body may hold
is gateway/upstream/chatbody.py's; translating other wires into chat and back is
gateway/upstream/adapters.py's.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import orjson

from gateway.config import ProviderTarget, anthropic_family, prepare_litellm_environment
from gateway.upstream.chatbody import (
    CHAT_PARAMETERS,
    dump,
    mark_stable_prefix,
    service_tier,
)
from gateway.upstream.failures import ProviderFailure, failure
from gateway.upstream.provider_stream import ProviderStream
from gateway.usage import Usage, from_litellm

__all__ = [
    "CHAT_PARAMETERS",
    "NO_KEY",
    "ProviderFailure",
    "ProviderRequest",
    "ProviderStream",
    "Providers",
    "Reply",
    "bundled_price_map",
    "mark_stable_prefix",
    "service_tier",
]

log = logging.getLogger("kvgate.providers")

# Sent when a target names no key: litellm would otherwise take one from the provider's usual
# environment variable, and only Settings reads the environment (keys are named explicitly).
NO_KEY = "kvgate-no-key-configured"
# From this size a chat body's call is followed by a collection of the young generations.
# litellm sends through httpx, whose response and its stream refer to each other: the
# request, with the whole body serialized, lives on in that cycle after the call until the
# collector happens to get to it (sixteen 3.9 MiB bodies through litellm left 16 such
# serialized bodies, 62 MiB, resident). Smaller bodies leave it to the collector's usual
# pace; a collection of the young generations takes a fraction of a millisecond.
COLLECT_AFTER_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One call to one target: the client's chat body and the key for that target."""

    target: ProviderTarget
    body: Mapping[str, Any]
    api_key: str | None = None
    stream: bool = False
    # The client's body as received, in bytes (0: unknown).
    body_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete response, in OpenAI's wire shape, with its usage normalised."""

    body: dict[str, Any]
    usage: Usage
    service_tier: str | None
    finish_reason: str | None
    raw_usage: dict[str, Any] | None = None  # litellm's usage, in OpenAI's shape


PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


def bundled_price_map() -> tuple[str, dict[str, Any]]:
    """litellm's version and the price map inside its package, read without importing it."""
    from importlib.metadata import version
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise ProviderFailure(
            "litellm is not installed: pip install 'kvgate[providers]'",
            status=None,
            retryable=False,
        )
    path = Path(next(iter(spec.submodule_search_locations))) / PRICE_MAP_FILE
    data = orjson.loads(path.read_bytes())
    return version("litellm"), data if isinstance(data, dict) else {}


def _no_cost(*_args: Any, **_kwargs: Any) -> None:
    """Stands in for litellm's cost calculator: its price map is not consulted per request."""
    return None


class Providers:
    """Calls hosted models through litellm; litellm is imported on the first ``load``."""

    def __init__(self) -> None:
        self._litellm: ModuleType | None = None

    def load(self) -> ModuleType:
        """Import litellm offline and quiet (seconds: call it at startup, off the loop)."""
        if self._litellm is None:
            prepare_litellm_environment()
            import litellm
            from litellm.litellm_core_utils.litellm_logging import Logging

            litellm.telemetry = False
            litellm.suppress_debug_info = True
            litellm.drop_params = True
            # litellm prices every response with its own map, twice (milliseconds of CPU:
            # benchmarks/README.md); kvgate bills from its dated book and never reads
            # that figure, so it is not computed.
            Logging.response_cost_calculator = _no_cost  # type: ignore[method-assign]
            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
                logging.getLogger(name).setLevel(logging.WARNING)
            self._litellm = litellm
        return self._litellm

    @property
    def loaded(self) -> bool:
        """Whether litellm has been imported by ``load``."""
        return self._litellm is not None

    @property
    def version(self) -> str:
        """The installed litellm's version."""
        from importlib.metadata import version

        return version("litellm")

    def arguments(self, request: ProviderRequest) -> dict[str, Any]:
        """litellm's keyword arguments for one call."""
        target = request.target
        body = {k: v for k, v in request.body.items() if k in CHAT_PARAMETERS}
        if target.cache_control and anthropic_family(target.litellm_model):
            mark_stable_prefix(body, target.cache_ttl)
        arguments: dict[str, Any] = {
            **body,
            "model": target.litellm_model,
            "api_key": request.api_key or NO_KEY,
            "timeout": target.timeout_s,
            # One call is one attempt: failover and its records are the gateway's.
            "num_retries": 0,
            "max_retries": 0,
            "drop_params": True,
        }
        if target.base_url is not None:
            arguments["api_base"] = target.base_url
        if request.stream:
            arguments["stream"] = True
            arguments["stream_options"] = {"include_usage": True}
        return arguments

    async def _acompletion(self, request: ProviderRequest) -> Any:
        """litellm's completion (streamed or not); provider errors raised as kvgate's."""
        litellm = self.load()
        try:
            return await litellm.acompletion(**self.arguments(request))
        except Exception as exc:  # litellm raises provider errors of many types
            raise failure(exc, request.target.litellm_model) from exc

    async def complete(self, request: ProviderRequest) -> Reply:
        """One completion, not streamed, usage normalised; provider errors raised as kvgate's."""
        response = await self._acompletion(request)
        if request.body_bytes >= COLLECT_AFTER_BYTES:
            # The serialized body is garbage now, in httpx's reference cycle: freed at once.
            gc.collect(1)
        body = dump(response)
        body.pop("usage", None)
        raw_usage = dump(response.usage) if getattr(response, "usage", None) else None
        choices = body.get("choices") or [{}]
        finish = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
        tier = service_tier({"service_tier": body.get("service_tier"), "usage": raw_usage})
        return Reply(
            body=body,
            usage=from_litellm(raw_usage),
            service_tier=tier,
            finish_reason=str(finish) if finish else None,
            raw_usage=raw_usage,
        )

    async def open_stream(self, request: ProviderRequest) -> ProviderStream:
        """A streamed completion, its first chunk read; provider errors raised as kvgate's."""
        source = await self._acompletion(request)
        stream = ProviderStream(source=source, request=request)
        await stream.start()
        return stream
