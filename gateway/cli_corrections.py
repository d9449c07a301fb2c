"""``kvgate prices correct``: a wrong price entry corrected by adjustments, never by
rewriting the records it priced (gateway/db/adjustments.py)."""

from __future__ import annotations

import csv
import os
import pwd
import re
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.cli_support import fail, sessions_for, settings

if TYPE_CHECKING:
    from gateway.db.adjustments import Line

TABLE = ("tenant", "day", "model", "requests", "billed", "corrected", "delta")
CSV_COLUMNS = (
    "price_id",
    "tenant",
    "tenant_id",
    "day",
    "model",
    "requests",
    "recorded",
    "adjusted",
    "billed",
    "corrected",
    "delta",
    "currency",
)


def os_user() -> str:
    """The operating-system user running the command (from the password database)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def csv_name(price_id: str) -> Path:
    """The dry run's default CSV, in the working directory, named for the entry."""
    return Path(f"correction-{re.sub(r'[^A-Za-z0-9@._-]', '_', price_id)}.csv")


def _rate(value: str | None, option: str) -> Decimal | None:
    from pricing.book import PriceError, parse_rate

    if value is None:
        return None
    try:
        return parse_rate(value, option)
    except PriceError as exc:
        fail(str(exc))


def prices_correct(
    entry: Annotated[str, typer.Option(help="The price entry's id (see `kvgate prices list`).")],
    input: Annotated[str, typer.Option(help="Corrected uncached input, per 1M tokens.")],
    cache_read: Annotated[str, typer.Option(help="Corrected cache read, per 1M tokens.")],
    reason: Annotated[str, typer.Option(help="Why: kept with every adjustment.")],
    cache_write: Annotated[
        str | None,
        typer.Option(
            help="Corrected cache write (5-minute), per 1M tokens (default: the entry's)."
        ),
    ] = None,
    output: Annotated[
        str | None, typer.Option(help="Corrected output, per 1M tokens (default: the entry's).")
    ] = None,
    by: Annotated[
        str | None, typer.Option(help="Who corrects it (default: the operating-system user).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print and write the table as CSV; store nothing.")
    ] = False,
    csv_path: Annotated[
        Path | None,
        typer.Option(
            "--csv",
            help="Write the table here (default with --dry-run: correction-ENTRY.csv in the "
            "working directory).",
        ),
    ] = None,
) -> None:
    """Correct a price entry's rates: per tenant × UTC day × model, what its requests were
    billed and what they should have been; applied as adjustments beside the records
    (which keep their cost), shown on statements. Applying it again changes nothing."""
    from gateway.db import adjustments
    from gateway.db.lookups import tenant_names
    from gateway.db.session import transaction
    from gateway.errors import NotFound

    if not reason.strip():
        fail("--reason must say why the entry is corrected")
    input_rate, cache_read_rate = _rate(input, "--input"), _rate(cache_read, "--cache-read")
    assert input_rate is not None and cache_read_rate is not None
    cache_write_rate, output_rate = _rate(cache_write, "--cache-write"), _rate(output, "--output")
    sessions = sessions_for(settings())
    # A dry run reads in a session of its own that is never committed: it stores nothing.
    with sessions() if dry_run else transaction(sessions) as session:
        try:
            stored = adjustments.entry(session, entry)
        except NotFound as exc:
            fail(exc.message)
        fix = adjustments.correction(
            stored,
            input=input_rate,
            cache_read=cache_read_rate,
            cache_write=cache_write_rate,
            output=output_rate,
            reason=reason.strip(),
            by=(by or "").strip() or os_user(),
        )
        earlier = adjustments.applied_before(session, fix)
        lines = adjustments.plan(session, fix) if dry_run else adjustments.apply(session, fix)
        names = tenant_names(session)
    currency = fix.entry.currency
    rates = ", ".join(f"{name} {rate}" for name, rate in fix.shown().items())
    typer.echo(f"{fix.entry.id} corrected to {rates} ({currency} per 1M tokens)")
    _table(lines, names)
    path = csv_path or (csv_name(fix.entry.id) if dry_run else None)
    if path is not None:
        try:
            _write_csv(path, lines, names, fix.entry.id, currency)
        except OSError as error:
            kept = "nothing was written" if dry_run else "the adjustments are stored"
            fail(f"--csv {path}: {error.strerror} ({kept}; the table above is complete)")
    delta = sum((line.delta for line in lines), Decimal(0))
    changed = sum(1 for line in lines if line.delta != 0)
    if dry_run:
        typer.echo(
            f"dry run: {changed} adjustment(s) totalling {delta:f} {currency} would be "
            "written; nothing was written"
        )
    elif changed:
        typer.echo(f"applied: {changed} adjustment(s) totalling {delta:f} {currency}")
    else:
        again = f" (this correction was applied before: {earlier} adjustment(s))"
        typer.echo(f"nothing to adjust: billed already matches{again if earlier else ''}")
    if path is not None:
        typer.echo(f"table written to {path.resolve()}")


def _table(lines: list[Line], names: dict[str, str]) -> None:
    typer.echo("\t".join(TABLE))
    for line in lines:
        name = names.get(line.tenant_id, line.tenant_id)
        typer.echo(
            f"{name}\t{line.day}\t{line.model}\t{line.requests}"
            f"\t{line.billed:f}\t{line.corrected:f}\t{line.delta:f}"
        )


def _write_csv(
    path: Path, lines: list[Line], names: dict[str, str], price_id: str, currency: str
) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for line in lines:
            writer.writerow(
                [
                    price_id,
                    names.get(line.tenant_id, line.tenant_id),
                    line.tenant_id,
                    line.day.isoformat(),
                    line.model,
                    line.requests,
                    f"{line.recorded:f}",
                    f"{line.adjusted:f}",
                    f"{line.billed:f}",
                    f"{line.corrected:f}",
                    f"{line.delta:f}",
                    currency,
                ]
            )
