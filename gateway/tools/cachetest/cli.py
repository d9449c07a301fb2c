"""``kvgate cachetest``: the cache test plan against any OpenAI-compatible endpoint."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer

from gateway.tools.cachetest.plan import PLANS, STAGES, Audit, RunConfig, parse_stages
from pricing.book import Rates


def cachetest(
    target: Annotated[
        str,
        typer.Option(
            help="Base URL of the endpoint, with or without /v1, as the openai SDK's base_url."
        ),
    ],
    key: Annotated[str, typer.Option(help="API key of the first tenant.")],
    model: Annotated[str, typer.Option(help="Model name to request.")],
    report: Annotated[Path, typer.Option(help="Directory for report.md, report.json, plots.")],
    second_key: Annotated[
        str | None, typer.Option(help="API key of a second tenant: runs the isolation audit.")
    ] = None,
    plan: Annotated[str, typer.Option(help="quick (minutes) or full.")] = "quick",
    stages: Annotated[
        str | None,
        typer.Option(help=f"Comma-separated stages to run (default: all): {','.join(STAGES)}."),
    ] = None,
    price_input: Annotated[
        str | None, typer.Option(help="USD per million uncached input tokens.")
    ] = None,
    price_cache_read: Annotated[
        str | None, typer.Option(help="USD per million cached input tokens.")
    ] = None,
    price_output: Annotated[str | None, typer.Option(help="USD per million output tokens.")] = None,
    block_size: Annotated[
        int | None,
        typer.Option(help="Tokens per KV block (default: the target's /metrics, else 16)."),
    ] = None,
    salt_per_key: Annotated[
        bool,
        typer.Option(help="Send each key's own cache_salt (a raw vLLM server has no tenants)."),
    ] = False,
    audit_timing_only: Annotated[
        bool,
        typer.Option(help="Withhold reported cached tokens from the audit: judge by TTFT alone."),
    ] = False,
    audit_alpha: Annotated[float, typer.Option(help="The audit's significance level.")] = 0.01,
    audit_min_effect: Annotated[
        float, typer.Option(help="The audit's minimum rank-biserial effect for sharing.")
    ] = 0.5,
    audit_samples: Annotated[
        int | None, typer.Option(help="Audit prompts per group (default: the plan's).")
    ] = None,
    prompt_words: Annotated[
        int | None, typer.Option(help="Words (about tokens) per long prompt (default: plan's).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 4,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the prompts and the audit order (default: new).")
    ] = None,
) -> None:
    """Run the cache test plan against an endpoint; exit 1 when tenant isolation fails."""
    from gateway.tools.cachetest.client import TargetError, server_root
    from gateway.tools.cachetest.report import write_report
    from gateway.tools.cachetest.runner import run

    try:
        server_root(target)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--target") from None
    if plan not in PLANS:
        raise typer.BadParameter(f"want one of {', '.join(PLANS)}", param_hint="--plan")
    try:
        chosen = parse_stages(stages, second_key=second_key is not None)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--stages") from None
    chosen_plan = PLANS[plan].with_prompt_words(prompt_words)
    if audit_samples is not None:
        chosen_plan = replace(chosen_plan, audit_samples=audit_samples)
    config = RunConfig(
        target=target,
        key=key,
        model=model,
        plan=chosen_plan,
        stages=chosen,
        second_key=second_key,
        price=_price(price_input, price_cache_read, price_output),
        block_size=block_size,
        salt_per_key=salt_per_key,
        max_tokens=max_tokens,
        seed=secrets.randbits(32) if seed is None else seed,
        audit=Audit(alpha=audit_alpha, min_effect=audit_min_effect, timing_only=audit_timing_only),
    )
    try:
        results = asyncio.run(run(config))
    except TargetError as error:
        typer.secho(f"\nerror: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    data = write_report(report, results)
    typer.echo(f"report: {report / 'report.md'} ({results.wall_s:.1f} s)")
    summary = data["summary"]
    typer.echo(f"token hit rate: {100 * summary['token_hit_rate']:.1f}%")
    if "isolation" in data["stages"]:
        typer.echo(f"isolation: {data['stages']['isolation']['verdict']}")
    if results.failed:
        raise typer.Exit(1)


def _price(input: str | None, cache_read: str | None, output: str | None) -> Rates | None:
    given = {"input": input, "cache_read": cache_read, "output": output}
    if all(v is None for v in given.values()):
        return None
    if input is None:
        raise typer.BadParameter("a price needs at least --price-input", param_hint="--price-input")
    try:
        rates = {name: Decimal(value) for name, value in given.items() if value is not None}
    except InvalidOperation:
        raise typer.BadParameter("prices are decimal numbers (USD per million)") from None
    return Rates(
        input=rates["input"],
        cache_read=rates.get("cache_read", rates["input"]),
        output=rates.get("output", Decimal(0)),
    )
