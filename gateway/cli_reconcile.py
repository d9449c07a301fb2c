"""``kvgate reconcile replicas``: kvgate's records per vLLM replica and window against the
replica's own counters (``gateway.db.figures.reconcile``)."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import orjson
import typer

from gateway.cli_breakers import moment
from gateway.cli_support import fail, sessions_for, settings

reconcile_app = typer.Typer(
    help="Reconcile kvgate's records against what others counted.", no_args_is_help=True
)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
SIX_PLACES = Decimal("0.000001")


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
    format: Annotated[str, typer.Option(help="table or json.")] = "table",
) -> None:
    """kvgate's records per vLLM replica and window against the replica's own counters.

    The prompt and cached tokens kvgate recorded against the replica's vllm:prompt_tokens
    and vllm:prefix_cache_hits (its /metrics, sampled by the gateways), and the drift
    between them; more than 1 % apart is flagged.
    """
    from gateway.db.figures.reconcile import DRIFT_LIMIT, reconcile

    if format not in ("table", "json"):
        fail("--format must be table or json")
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
