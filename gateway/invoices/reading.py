"""A provider's export file → a ``Bill``: JSON read with exact numbers, then the
provider's format."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.invoices.anthropic import read_anthropic
from gateway.invoices.openai import read_openai
from gateway.invoices.shapes import Bill, InvoiceError

READERS: dict[str, Callable[[Any], Bill]] = {"openai": read_openai, "anthropic": read_anthropic}
PROVIDERS = tuple(READERS)


def read_bill(provider: str, document: Any) -> Bill:
    """The bill a provider's parsed export adds up to."""
    if provider not in READERS:
        raise InvoiceError(f"provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
    return READERS[provider](document)


def load_bill(provider: str, path: Path) -> Bill:
    """The bill in a provider's export file; ``InvoiceError`` naming the file if it is not one."""
    try:
        # Numbers as Decimals: money stays exact (OpenAI's amounts are JSON numbers).
        document = json.loads(path.read_bytes(), parse_float=Decimal)
    except OSError as exc:
        raise InvoiceError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvoiceError(f"{path}: not JSON ({exc})") from None
    try:
        return read_bill(provider, document)
    except InvoiceError as exc:
        raise InvoiceError(f"{path}: {exc}") from None
