"""``kvgate replay``: replay a Mooncake trace offline against routing policies, or live.

The lead's ``gateway/cli.py`` registers `replay` as a command; it is a plain function with
typer annotations, so it can also be called directly (tests do).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from gateway.routing.policy import DEFAULT_TUNABLES, POLICIES
from gateway.tools.replay import offline
from gateway.tools.replay.analysis import TraceAnalysis, analyze, infinite_ceiling
from gateway.tools.replay.live import first_model, record_totals, replay_live, summarize_live
from gateway.tools.replay.metrics import PolicySummary, parse_price, summarize
from gateway.tools.replay.report import (
    ReportContext,
    gateways_table,
    git_commit,
    kvgate_version,
    policy_table,
    tier_table,
)
from gateway.tools.replay.report import write_report as write_report_files
from gateway.tools.replay.trace import TraceRequest, load_trace
from gateway.tools.sim.options import block_ms_option
from gateway.tools.sim.timing import (
    DISK_MS_PER_TOKEN,
    HOST_MS_PER_TOKEN,
    TimingModel,
    block_load_ms,
)
from pricing.book import Rates

DEFAULT_POLICIES = "kv-aware,round-robin,least-loaded,random"


def replay(
    trace: Annotated[
        Path, typer.Argument(help="Mooncake JSONL trace.", exists=True, dir_okay=False)
    ],
    replicas: Annotated[int, typer.Option(help="Replicas in the simulated fleet.", min=1)] = 8,
    capacity_blocks: Annotated[
        int,
        typer.Option(help="Prefix-cache capacity per replica, in blocks of --block-tokens.", min=1),
    ] = 4000,
    policies: Annotated[
        str, typer.Option(help=f"Comma-separated routing policies, of: {', '.join(POLICIES)}.")
    ] = DEFAULT_POLICIES,
    report: Annotated[
        Path | None,
        typer.Option(help="Write report.md, report.json, PNG plots and per-request CSVs here."),
    ] = None,
    price: Annotated[
        str | None,
        typer.Option(
            help="Prices for cost columns: 'input=X,cache_read=Y,output=Z', USD per million tokens."
        ),
    ] = None,
    prefill_tokens_per_s: Annotated[
        float,
        typer.Option(
            help="Uncached prompt tokens a replica prefills per second (one prefill at a time)."
        ),
    ] = 10_000.0,
    decode_tokens_per_s: Annotated[
        float, typer.Option(help="Output tokens per second of each running sequence.")
    ] = 40.0,
    max_num_seqs: Annotated[
        int, typer.Option(help="Sequences a replica runs at once; the rest queue.", min=1)
    ] = 64,
    block_tokens: Annotated[
        int, typer.Option(help="Tokens per trace hash id (512 for Mooncake traces).", min=1)
    ] = 512,
    index: Annotated[
        str,
        typer.Option(
            help="The router's block index: 'approximate' (learned from its own routing, as "
            "the gateway does without KV events) or 'exact' (the caches' true contents)."
        ),
    ] = "approximate",
    target: Annotated[
        str | None,
        typer.Option(help="Live mode: base URL of a running kvgate to send the trace through."),
    ] = None,
    key: Annotated[str | None, typer.Option(help="Live mode: the API key to send.")] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Live mode: model name (default: the first one /v1/models lists)."),
    ] = None,
    speed: Annotated[
        float,
        typer.Option(
            help="Live mode: divide arrival times by this (2 = twice as fast).", min=0.001
        ),
    ] = 1.0,
    limit: Annotated[
        int | None, typer.Option(help="Replay only the first N requests of the trace.", min=1)
    ] = None,
    cpu_blocks: Annotated[
        int,
        typer.Option(help="Host-memory tier per replica, in blocks: keeps what GPU evicts.", min=0),
    ] = 0,
    cpu_block_ms: Annotated[float | None, block_ms_option("host memory", "--block-tokens")] = None,
    disk_blocks: Annotated[
        int,
        typer.Option(
            help="Disk tier per replica, in blocks: keeps what host memory evicts.", min=0
        ),
    ] = 0,
    disk_block_ms: Annotated[float | None, block_ms_option("disk", "--block-tokens")] = None,
    gateways: Annotated[
        str,
        typer.Option(
            help="Independent gateway instances behind a round-robin balancer (K, or a "
            "list such as 1,2,4,8: each is replayed and the hit-rate loss reported)."
        ),
    ] = "1",
) -> None:
    """Replay a trace: the hit-rate ceilings, then each routing policy's results."""
    requests = load_trace(trace, limit=limit)
    if not requests:
        raise typer.BadParameter("the trace has no requests", param_hint="TRACE")
    if target is not None:
        _replay_live(
            requests, target=target, key=key, model=model, speed=speed, block_tokens=block_tokens
        )
        return
    names = _policies(policies)
    if index not in offline.INDEX_MODES:
        raise typer.BadParameter(f"want one of {offline.INDEX_MODES}", param_hint="--index")
    if disk_blocks and not cpu_blocks:
        raise typer.BadParameter(
            "a disk tier keeps what host memory evicts: give --cpu-blocks too",
            param_hint="--disk-blocks",
        )
    counts = _gateways(gateways)
    token_price = _price(price)
    timing = TimingModel(
        prefill_tokens_per_s=prefill_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        max_num_seqs=max_num_seqs,
        cpu_block_ms=block_load_ms(cpu_block_ms, HOST_MS_PER_TOKEN, block_tokens)
        if cpu_blocks
        else 0.0,
        disk_block_ms=block_load_ms(disk_block_ms, DISK_MS_PER_TOKEN, block_tokens)
        if disk_blocks
        else 0.0,
    )
    config = offline.ReplayConfig(
        replicas=replicas,
        capacity_blocks=capacity_blocks,
        block_tokens=block_tokens,
        timing=timing,
        index=index,
        cpu_blocks=cpu_blocks,
        disk_blocks=disk_blocks,
    )
    analysis = analyze(
        requests,
        replicas=replicas,
        capacity_blocks=capacity_blocks,
        block_tokens=block_tokens,
        lower_blocks=cpu_blocks + disk_blocks,
    )
    _echo_ceilings(analysis, replicas, capacity_blocks)
    runs = []
    summaries: list[PolicySummary] = []
    for count in counts:
        # Instances apart read the replicas' load as the gateway does, every second.
        fleet = replace(config, gateways=count, load_interval_s=None if count == 1 else 1.0)
        for name in names:
            label = name if count == 1 else f"{name}, {count} gateways"
            with _progress(label, len(requests)) as advance:
                run = offline.replay(requests, name, fleet, progress=advance)
            runs.append(run)
            summaries.append(summarize(run, ceiling=analysis.ceiling.rate, price=token_price))
    typer.echo(f"router index: {index}\n")
    first = [s for s in summaries if s.gateways == counts[0]]
    typer.echo(policy_table(first, priced=token_price is not None))
    if analysis.pooled_tiers is not None:
        weights = config.tier_weights
        tiers = f"{capacity_blocks:,} GPU, {cpu_blocks:,} host memory ({timing.cpu_block_ms:g} ms)"
        credit = f"host {weights.cpu:.3f}"
        if disk_blocks:
            tiers += f", {disk_blocks:,} disk ({timing.disk_block_ms:g} ms)"
            credit += f", disk {weights.storage:.3f}"
        typer.echo(
            f"\ncache tiers per replica, in blocks (a block's load time): {tiers}; "
            f"router's tier weights: {credit}"
        )
        typer.echo(
            f"pooled ceiling of the combined capacity "
            f"({analysis.pooled_tiers_capacity_blocks:,} blocks in one LRU cache): "
            f"{100 * analysis.pooled_tiers.rate:.2f}%\n"
        )
        typer.echo(tier_table(first, analysis))
    if counts != [1]:
        typer.echo("\ngateway instances behind a round-robin balancer:\n")
        typer.echo(gateways_table(summaries))
    if report is not None:
        context = ReportContext(
            trace=str(trace),
            replicas=replicas,
            capacity_blocks=capacity_blocks,
            block_tokens=block_tokens,
            timing=timing,
            index=index,
            tunables=DEFAULT_TUNABLES,
            price=token_price,
            version=kvgate_version(),
            commit=git_commit(Path(__file__).resolve().parent),
            cpu_blocks=cpu_blocks,
            disk_blocks=disk_blocks,
            gateways=tuple(counts),
        )
        write_report_files(
            report,
            context=context,
            analysis=analysis,
            requests=requests,
            runs=runs,
            summaries=summaries,
        )
        typer.echo(f"\nreport written to {report}")


def _policies(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICIES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown {', '.join(unknown) or 'empty list'}; known: {', '.join(POLICIES)}",
            param_hint="--policies",
        )
    return names


def _gateways(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(count < 1 for count in counts):
        raise typer.BadParameter(
            f"want a count of at least 1, or a list of them (1,2,4,8), not {text!r}",
            param_hint="--gateways",
        )
    return counts


def _price(text: str | None) -> Rates | None:
    if text is None:
        return None
    try:
        return parse_price(text)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--price") from error


def _echo_ceilings(analysis: TraceAnalysis, replicas: int, capacity_blocks: int) -> None:
    typer.echo(f"requests: {analysis.requests:,}")
    typer.echo(f"infinite-cache ceiling: {100 * analysis.ceiling.rate:.2f}%")
    typer.echo(
        f"pooled ceiling ({replicas} x {capacity_blocks:,} blocks in one LRU cache): "
        f"{100 * analysis.pooled.rate:.2f}%"
    )


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on a terminal; nothing when output goes to a file or pipe."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=total)
        step = max(1, total // 200)

        def advance(done: int) -> None:
            if done % step == 0 or done == total:
                bar.update(task, completed=done)

        yield advance


def _replay_live(
    requests: list[TraceRequest],
    *,
    target: str,
    key: str | None,
    model: str | None,
    speed: float,
    block_tokens: int,
) -> None:
    if key is None:
        raise typer.BadParameter("live mode needs an API key", param_hint="--key")

    async def run() -> None:
        name = model or await first_model(target, key)
        # The records are read back as the difference of the caller's own statement:
        # use a key whose tenant sends nothing else meanwhile.
        day = datetime.now(UTC).date()
        before = await record_totals(target, key, start=day, end=day)
        typer.echo(f"sending {len(requests):,} requests to {target} ({name}), speed x{speed:g}")
        with _progress("live", len(requests)) as advance:
            outcomes = await replay_live(
                requests,
                target=target,
                key=key,
                model=name,
                speed=speed,
                block_tokens=block_tokens,
                progress=advance,
            )
        summary = summarize_live(outcomes)
        ceiling = infinite_ceiling(requests, block_tokens=block_tokens).rate
        typer.echo(f"completed: {summary.completed:,} of {summary.requests:,}")
        typer.echo(
            f"token hit rate (reported by the replicas): {100 * summary.token_hit_rate:.2f}%"
        )
        typer.echo(f"infinite-cache ceiling of these requests: {100 * ceiling:.2f}%")
        if ceiling:
            typer.echo(f"routing efficiency: {100 * summary.token_hit_rate / ceiling:.1f}%")
        typer.echo(f"TTFT p50 {summary.ttft_p50_s:.3f} s, p99 {summary.ttft_p99_s:.3f} s")
        await asyncio.sleep(1.0)  # the gateway writes records in batches
        recorded = (
            await record_totals(target, key, start=day, end=datetime.now(UTC).date())
        ).minus(before)
        typer.echo(
            f"recorded by the gateway: {recorded.requests:,} requests, "
            f"{recorded.prompt_tokens:,} prompt tokens, token hit rate "
            f"{100 * recorded.token_hit_rate:.2f}%, cost {recorded.cost_total:f} USD"
        )

    asyncio.run(run())
