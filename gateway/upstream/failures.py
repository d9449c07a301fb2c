"""A provider call that failed, as kvgate says it: the one error type of the hosted wires.

ProviderFailure (UpstreamError)   status as the provider answered; ``retryable`` for
                                  connect errors, timeouts, 429 and 5xx
"""

from __future__ import annotations

from gateway.errors import UpstreamError


class ProviderFailure(UpstreamError):
    """A provider call that failed; ``retryable`` when another target may well succeed."""

    def __init__(self, message: str, *, status: int | None, retryable: bool) -> None:
        super().__init__(message)
        self.provider_status = status
        self.retryable = retryable
        if status is not None and 400 <= status < 500:
            # The client's request (or its quota) is at fault: say so with the same status.
            self.status = status
            self.type = "rate_limit_error" if status == 429 else "invalid_request_error"


def failure(exc: Exception, model: str) -> ProviderFailure:
    """Map any litellm exception: they all carry the provider's HTTP status, if there was one."""
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    name = type(exc).__name__
    connect = name in {"APIConnectionError", "Timeout", "ServiceUnavailableError"}
    retryable = connect or status is None or status == 429 or status >= 500
    message = " ".join(str(getattr(exc, "message", None) or exc).split())
    return ProviderFailure(
        f"{model}: {name} ({status or 'no status'}): {message[:300]}",
        status=status,
        retryable=retryable,
    )
