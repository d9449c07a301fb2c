"""``kvgate reconcile replicas``: kvgate's records per vLLM replica and window against the
replica's own counters (``gateway.db.figures.reconcile``); ``kvgate reconcile invoice``:
its records of hosted models per UTC day × model against a provider's usage and cost
export (``gateway.invoices``, ``gateway.db.figures.invoices``)."""

from __future__ import annotations

import re
import sys
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from gateway.cli_breakers import moment
from gateway.cli_support import TableOrJson, day, fail, one_of, sessions_for, settings

if TYPE_CHECKING:
    from gateway.invoices.compare import Compared, Side, Variance

reconcile_app = typer.Typer(
    help="Reconcile kvgate's records against what others counted.", no_args_is_help=True
)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
SIX_PLACES = Decimal("0.000001")
NANO = Decimal("0.000000001")


def duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``1d`` or plain seconds."""
    match = _DURATION.match(text.strip())
    if match is None or float(match[1]) <= 0:
        fail(f"--window must be a duration like 15m, 1h or 3600, not {text!r}")
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])


@reconcile_app.command("replicas")
def reconcile_replicas(
    since: Annotated[str, typer.Option(help="From this UTC day or moment.")],
    until: Annotated[str | None, typer.Option(help="Up to this UTC day or moment (now).")] = None,
    window: Annotated[str, typer.Option(help="Window length: 15m, 1h, 1d, seconds.")] = "1h",
    replica: Annotated[str | None, typer.Option(help="Only this replica (its URL).")] = None,
    format: TableOrJson = "table",
) -> None:
    """kvgate's records per vLLM replica and window against the replica's own counters.

    The prompt and cached tokens kvgate recorded against the replica's vllm:prompt_tokens
    and vllm:prefix_cache_hits (its /metrics, sampled by the gateways), and the drift
    between them; more than 1 % apart is flagged.
    """
    from gateway.db.figures.reconcile import DRIFT_LIMIT, reconcile

    one_of(format, "table", "json", option="--format")
    lower = moment(since, option="--since")
    upper = moment(until, option="--until") if until else datetime.now(UTC)
    if upper <= lower:
        fail("--until must be after --since")
    with sessions_for(settings())() as session:
        found = reconcile(
            session,
            since=lower,
            until=upper,
            window=duration(window),
            upstreams=(replica.rstrip("/"),) if replica else (),
        )
    apart = [w for w in found if w.over()]
    if format == "json":
        sys.stdout.buffer.write(orjson.dumps([_json(w) for w in found], option=orjson.OPT_INDENT_2))
        sys.stdout.buffer.write(b"\n")
    else:
        typer.echo(
            "replica\tfrom\tto\trequests\tprompt_recorded\tprompt_counted\tprompt_drift"
            "\tcached_recorded\tcached_counted\tcached_drift\tqueries_counted\tnote"
        )
        for w in found:
            note = ", ".join(
                [*(f"{name} apart" for name in w.over()), *(["restarted"] if w.restarted else [])]
            )
            typer.echo(
                f"{w.upstream}\t{_at(w.sampled_from)}\t{_at(w.sampled_to)}\t{w.recorded.requests}"
                f"\t{w.recorded.prompt_tokens}\t{w.engine.prompt_tokens}\t{_percent(w.prompt_drift)}"
                f"\t{w.recorded.cache_read_tokens}\t{w.engine.prefix_cache_hits}"
                f"\t{_percent(w.cached_drift)}\t{w.engine.prefix_cache_queries}\t{note or '-'}"
            )
    if not found:
        typer.echo("no replica samples in this period (the gateway stores them)", err=True)
    elif apart:
        typer.echo(
            f"{len(apart)} window(s) more than {DRIFT_LIMIT:%} apart",
            err=True,
        )


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _percent(value: Decimal | None) -> str:
    return "-" if value is None else f"{float(value):+.2%}"


def _ratio(value: Decimal | None) -> str | None:
    return None if value is None else str(value.quantize(SIX_PLACES))


def _json(w: Any) -> dict[str, Any]:
    return {
        "replica": w.upstream,
        "start": _at(w.start),
        "end": _at(w.end),
        "sampled_from": _at(w.sampled_from),
        "sampled_to": _at(w.sampled_to),
        "sampler": w.sampler,
        "restarted": w.restarted,
        "requests": w.recorded.requests,
        "prompt_tokens": {
            "recorded": w.recorded.prompt_tokens,
            "counted": w.engine.prompt_tokens,
            "drift": _ratio(w.prompt_drift),
        },
        "cached_tokens": {
            "recorded": w.recorded.cache_read_tokens,
            "counted": w.engine.prefix_cache_hits,
            "drift": _ratio(w.cached_drift),
        },
        "prefix_cache_queries": w.engine.prefix_cache_queries,
        "output_tokens": {
            "recorded": w.recorded.output_tokens,
            "counted": w.engine.generation_tokens,
        },
        "apart": w.over(),
    }


@reconcile_app.command("invoice")
def reconcile_invoice(
    file: Annotated[Path, typer.Argument(help="The provider's usage and cost export (JSON).")],
    provider: Annotated[str, typer.Option(help="openai or anthropic.")],
    since: Annotated[
        str | None, typer.Option(help="First UTC day, YYYY-MM-DD (default: the file's first).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Last UTC day, YYYY-MM-DD (default: the file's last).")
    ] = None,
    format: TableOrJson = "table",
) -> None:
    """kvgate's records of a provider's hosted models against the provider's own bill.

    Per UTC day × model: the tokens per class and the cost kvgate recorded of the requests
    it sent to the provider, the provider's from its usage and cost export, and the
    variance (kvgate - provider, absolute and as a percentage of the provider's).
    """
    from gateway.db.figures.invoices import hosted_days
    from gateway.invoices.compare import Recorded, compare
    from gateway.invoices.reading import PROVIDERS, load_bill
    from gateway.invoices.shapes import InvoiceError, Tokens

    one_of(format, "table", "json", option="--format")
    if provider not in PROVIDERS:
        fail(f"--provider must be {' or '.join(PROVIDERS)}, not {provider!r}")
    first, last = _day(since, "--since"), _day(until, "--until")
    try:
        bill = load_bill(provider, file)
    except InvoiceError as exc:
        fail(str(exc))
    first, last = first or bill.first_day, last or bill.last_day
    if first is None or last is None:
        fail("the file holds no buckets: give --since and --until")
    if last < first:
        fail("--until must not be before --since")
    with sessions_for(settings())() as session:
        days = hosted_days(
            session,
            since=datetime.combine(first, time(), tzinfo=UTC),
            until=datetime.combine(last + timedelta(days=1), time(), tzinfo=UTC),
        )
    recorded = [
        Recorded(
            day,
            upstream,
            s.requests,
            Tokens(s.uncached_tokens, s.cache_read_tokens, s.cache_write_tokens, s.output_tokens),
            s.cost_total,
        )
        for day, upstream, s in days
    ]
    found = compare(bill, recorded, since=first, until=last)
    if format == "json":
        sys.stdout.buffer.write(
            orjson.dumps([_invoice_json(c) for c in found], option=orjson.OPT_INDENT_2)
        )
        sys.stdout.buffer.write(b"\n")
    else:
        typer.echo("day\tmodel\tmeasure\tkvgate\tprovider\tvariance\tpercent")
        for c in found:
            for measure, kvgate, theirs, apart in _measures(c):
                typer.echo(
                    f"{c.day}\t{c.model}\t{measure}\t{kvgate}\t{_or_dash(theirs)}"
                    f"\t{_or_dash(apart and apart.absolute)}\t{_signed(apart)}"
                )
    for warning in bill.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if not bill.has_usage:
        typer.echo("the file holds no usage report: tokens are not compared", err=True)
    if not bill.has_costs:
        typer.echo("the file holds no cost report: cost is not compared", err=True)
    apart_rows = sum(1 for c in found if c.apart())
    typer.echo(f"{first} to {last}: {len(found)} day × model, {apart_rows} apart", err=True)


def _day(text: str | None, option: str) -> date | None:
    return None if text is None else day(text, option=option)


def _money(value: Decimal | int) -> str:
    """Exact, with at least nine places (the nano-dollar kvgate records to)."""
    amount = Decimal(value)
    exponent = amount.as_tuple().exponent
    exact = amount.quantize(NANO) if isinstance(exponent, int) and exponent > -9 else amount
    return f"{exact:f}"


def _or_dash(value: object) -> str:
    if value is None:
        return "-"
    return _money(value) if isinstance(value, Decimal) else str(value)


def _signed(apart: Variance | None) -> str:
    return "-" if apart is None or apart.percent is None else f"{apart.percent:+}%"


def _measures(c: Compared) -> list[tuple[str, object, object, Variance | None]]:
    """(measure, kvgate's, the provider's, variance) for requests, each class, cost."""
    out: list[tuple[str, object, object, Variance | None]] = [
        ("requests", c.kvgate.requests, c.provider.requests, None)
    ]
    for name, apart in c.token_variance().items():
        out.append((name, _tokens(c.kvgate, name), _tokens(c.provider, name), apart))
    cost = _money(c.kvgate.cost or Decimal(0))
    out.append(("cost_usd", cost, c.provider.cost, c.cost_variance()))
    return out


def _tokens(side: Side, name: str) -> int | None:
    return None if side.tokens is None else side.tokens.as_dict()[name]


def _invoice_json(c: Compared) -> dict[str, Any]:
    measures = _measures(c)
    tokens = {
        name: {
            "kvgate": kvgate,
            "provider": theirs,
            "variance": None if apart is None else apart.absolute,
            "percent": None if apart is None or apart.percent is None else str(apart.percent),
        }
        for name, kvgate, theirs, apart in measures[1:-1]
    }
    _, kvgate_cost, provider_cost, cost_apart = measures[-1]
    return {
        "day": c.day.isoformat(),
        "model": c.model,
        "provider_models": list(c.provider_models),
        "requests": {"kvgate": c.kvgate.requests, "provider": c.provider.requests},
        "tokens": tokens,
        "cost_usd": {
            "kvgate": kvgate_cost,
            "provider": None if provider_cost is None else _or_dash(provider_cost),
            "variance": None if cost_apart is None else _money(cost_apart.absolute),
            "percent": None
            if cost_apart is None or cost_apart.percent is None
            else str(cost_apart.percent),
        },
    }
