"""SQLAlchemy 2 models: the only place the database's shape is written down.

Money is Numeric(18, 9) (nano-dollars, exact); times are stored in UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NANOS = Decimal(1_000_000_000)
NANO = Decimal("0.000000001")
# A request's token count of one class: 64-bit (0018; Postgres's integer stops at 2**31 - 1,
# and a record the database refuses is a record lost); SQLite's INTEGER is 64-bit already.
TOKENS = BigInteger().with_variant(Integer(), "sqlite")
# Characters of the free text an upstream sends that a request's row keeps (longer is cut:
# gateway/accounting/store.py).
FINISH_REASON_CHARS = 50
SERVICE_TIER_CHARS = 32
MAX_END_USER = 256  # characters of an end-user id (gateway/api/attribution.py)
# A tag key as stored in ``requests.tags`` and read back by JSON path (SQLite's
# '$."key"'): 1 to 64 characters, none of them '=', ',', '"' or a backslash.
TAG_KEY = re.compile(r'[^=,"\\]{1,64}')


class Money(TypeDecorator[Decimal]):
    """Exact money: Numeric(18, 9) on Postgres; integer nano-units on SQLite.

    SQLite keeps NUMERIC values as binary floats, so its SUM() would drift in the last
    digits; as integers its sums are exact. ``func.sum`` keeps this type, so aggregates
    come back as exact Decimals on both databases.
    """

    impl = Numeric(18, 9, asdecimal=True)
    cache_ok = True

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Decimal | int | None:
        """The amount as stored: integer nano-units on SQLite, else quantized to the nano."""
        if value is None:
            return None
        value = Decimal(value).quantize(NANO)
        return int(value * NANOS) if dialect.name == "sqlite" else value

    def process_result_value(self, value: object, dialect: Dialect) -> Decimal | None:
        """The stored amount as a Decimal, to the nano."""
        if value is None:
            return None
        if dialect.name == "sqlite":
            return (Decimal(int(value)) / NANOS).quantize(NANO)  # type: ignore[call-overload]
        return Decimal(value).quantize(NANO)  # type: ignore[arg-type]


Rate = Money


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, on SQLite (which has no time zones) too."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """The moment as stored, in UTC (naive on SQLite); ValueError if it is naive."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """The stored moment as an aware UTC datetime."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index of only the rows matching ``where`` (SQL), on Postgres and SQLite alike."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


class Base(DeclarativeBase):
    pass


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Tenants with the same cache_group share a KV-cache scope (operator's explicit choice).
    cache_group: Mapped[str | None] = mapped_column(String(200), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Opted in to keeping the text around its prompts' prefix breaks (added by 0010).
    break_context: Mapped[bool] = mapped_column(Boolean, server_default=false())


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class PriceRow(Base):
    __tablename__ = "prices"

    id: Mapped[str] = mapped_column(String(300), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    input: Mapped[Decimal] = mapped_column(Rate())
    cache_read: Mapped[Decimal] = mapped_column(Rate())
    cache_write: Mapped[Decimal | None] = mapped_column(Rate(), default=None)
    output: Mapped[Decimal] = mapped_column(Rate())
    currency: Mapped[str] = mapped_column(String(8), default="USD")
    source: Mapped[str] = mapped_column(Text, default="")
    captured_on: Mapped[date | None] = mapped_column(Date, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    cache_write_1h: Mapped[Decimal | None] = mapped_column(Rate(), default=None)
    # Long-context and service-tier rates: JSON with Decimal strings (Price.variants()).
    variants: Mapped[str | None] = mapped_column(Text, default=None)


class ChangeRow(Base):
    """A revision counter per kind of data the gateways hold in memory (keys, prices, ...).

    Every change of that kind bumps it in the change's own transaction (db/changes.py), so
    a gateway that has loaded revision N knows whether its copy is current.
    """

    __tablename__ = "changes"

    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger, default=0)
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class CostColumns:
    """Exact money per token class, its total and the no-cache equivalent (``sums.COSTS``):
    one attempt's in ``requests``, their sums in ``usage_hours``."""

    # Mixin columns follow the class's own (the migrations, not this order, make the tables).
    cost_uncached: Mapped[Decimal] = mapped_column(Money())
    cost_cache_read: Mapped[Decimal] = mapped_column(Money())
    cost_cache_write: Mapped[Decimal] = mapped_column(Money())
    cost_output: Mapped[Decimal] = mapped_column(Money())
    cost_total: Mapped[Decimal] = mapped_column(Money())
    cost_uncached_equivalent: Mapped[Decimal] = mapped_column(Money())


class TokenSumColumns:
    """A rollup's attempts and their tokens per class (``pricing.tokens.TokenClasses``)."""

    requests: Mapped[int] = mapped_column(BigInteger)
    uncached_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)


class CeilingColumns:
    """Requests that carry a hit-rate ceiling, and their tokens, so that efficiency compares
    like with like (``gateway.db.figures.spend.Ceilings`` reads them from either rollup)."""

    ceiling_requests: Mapped[int] = mapped_column(BigInteger)
    ceiling_prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    ceiling_cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    ceiling_cached_tokens: Mapped[int] = mapped_column(BigInteger)
    # Of ceiling_requests, those whose ceiling was exact (the rest are approximate).
    exact_ceiling_requests: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class RequestRow(CostColumns, Base):
    """One attempt of one request: the unit everything else sums."""

    __tablename__ = "requests"
    __table_args__ = (
        # A tenant's requests of a period: the Requests page, statements split by end user
        # or tag. (0017 made it cover a statement's columns; 0019 made it plain again, a
        # statement's lines being kept by the writer.)
        Index("ix_requests_tenant_started", "tenant_id", "started_at"),
        Index("ix_requests_started", "started_at"),
        Index("ix_requests_interaction", "interaction_id"),
        Index("ix_requests_model_started", "model", "started_at"),
        # Cost attribution reads only the requests that name an end user or carry tags
        # (added by 0016): without these, a tenant's every request in the period.
        partial_index(
            "ix_requests_end_user", "tenant_id", "started_at", where="end_user IS NOT NULL"
        ),
        partial_index("ix_requests_tags", "tenant_id", "started_at", where="tags IS NOT NULL"),
    )

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    api_key_id: Mapped[str] = mapped_column(String(64))
    interaction_id: Mapped[str] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    model: Mapped[str] = mapped_column(String(200))
    # The inference endpoint's path (added by 0013); NULL: recorded before kvgate kept it.
    endpoint: Mapped[str | None] = mapped_column(String(40), default=None)
    deployment: Mapped[str] = mapped_column(String(200))
    upstream: Mapped[str] = mapped_column(String(500))
    policy: Mapped[str] = mapped_column(String(50), default="")
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    first_token_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str | None] = mapped_column(String(FINISH_REASON_CHARS), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    uncached_tokens: Mapped[int] = mapped_column(TOKENS, default=0)
    cache_read_tokens: Mapped[int] = mapped_column(TOKENS, default=0)
    cache_write_tokens: Mapped[int] = mapped_column(TOKENS, default=0)
    output_tokens: Mapped[int] = mapped_column(TOKENS, default=0)
    usage_source: Mapped[str] = mapped_column(String(16), default="reported")
    # The part of cache_write_tokens written for an hour, and the tier the provider served:
    # with the price id they say which rates the stored costs were computed with.
    cache_write_1h_tokens: Mapped[int] = mapped_column(TOKENS, default=0)
    service_tier: Mapped[str | None] = mapped_column(String(SERVICE_TIER_CHARS), default=None)
    predicted_cached_tokens: Mapped[int | None] = mapped_column(TOKENS, default=None)
    # At least cache_read_tokens (``Record.stored_ceiling``), so efficiency <= 100 %.
    ceiling_cached_tokens: Mapped[int | None] = mapped_column(TOKENS, default=None)
    # Whether prediction and ceiling were counted in the replica's tokens (False: estimated
    # from character blocks, the router having no tokenizer); NULL with no ceiling, or
    # recorded before kvgate kept it.
    ceiling_exact: Mapped[bool | None] = mapped_column(Boolean, default=None)
    # Of cache_read_tokens, those the replica served from host memory and from disk (the
    # rest came from GPU memory); NULL where the replica does not report tiers.
    cache_read_host_tokens: Mapped[int | None] = mapped_column(TOKENS, default=None)
    cache_read_disk_tokens: Mapped[int | None] = mapped_column(TOKENS, default=None)
    price_id: Mapped[str | None] = mapped_column(String(300), default=None)
    # The entry's rate set the costs were computed with: standard, long_context or a tier
    # (None: recorded before kvgate kept it; such rows were priced by their service tier).
    rate_class: Mapped[str | None] = mapped_column(String(32), default=None)
    # Prefix breakers (added by 0010): where the prompt's block chain first left the
    # interaction's previous request's (token offset), the tokens of it not reused, whether
    # that was early; the text around it (JSON) for tenants that opted in. NULL: no break.
    break_tokens: Mapped[int | None] = mapped_column(TOKENS, default=None)
    lost_tokens: Mapped[int | None] = mapped_column(TOKENS, default=None)
    break_early: Mapped[bool | None] = mapped_column(Boolean, default=None)
    break_context: Mapped[str | None] = mapped_column(Text, default=None)
    # Cost attribution (added by 0011): the end user the client named (OpenAI's ``user``)
    # and the request's tags (a JSON object of strings); NULL when none was given.
    end_user: Mapped[str | None] = mapped_column(String(MAX_END_USER), default=None)
    tags: Mapped[dict[str, str] | None] = mapped_column(JSON(none_as_null=True), default=None)


# -- hourly rollups, maintained by the recorder in the insert's transaction -------------
#
# Every key column is NOT NULL so that upserts find their row on both databases (NULLs
# never conflict); an unpriced request's price_id is '' here.


class UsageHourRow(TokenSumColumns, CostColumns, CeilingColumns, Base):
    """Per UTC hour × tenant × model × price entry × status: sums of the requests' columns."""

    __tablename__ = "usage_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    price_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    # (tenant, interaction, model, hour) cells first seen completed here; see InteractionCellRow.
    completed_cells: Mapped[int] = mapped_column(BigInteger)
    # The part of cache_write_tokens written for an hour (added by 0006).
    cache_write_1h_tokens: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # Cells first seen completed by a priced attempt here (a row of a priced entry).
    priced_completed_cells: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # Sum over requests of max(ceiling - cache_read, 0): misses perfect routing would have hit.
    avoidable_miss_tokens: Mapped[int] = mapped_column(BigInteger)


class ReplicaHourRow(CeilingColumns, Base):
    """Per UTC hour × model × upstream replica: load and cache figures for routing."""

    __tablename__ = "replica_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(500), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    failed_requests: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    predicted_requests: Mapped[int] = mapped_column(BigInteger)
    predicted_cached_tokens: Mapped[int] = mapped_column(BigInteger)
    predicted_cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    # Requests whose replica reported cached tokens by tier, their cached tokens, and of
    # those the host memory's and the disk's (GPU memory's: the rest).
    tier_requests: Mapped[int] = mapped_column(BigInteger, server_default="0")
    tier_cache_read_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    host_cached_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    disk_cached_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")


class TtftHourRow(Base):
    """Time-to-first-token histogram per UTC hour × tenant × model × cold/warm.

    Buckets are log-spaced, eight per doubling (about 9 % wide): percentiles of any period
    come from summed counts, no raw rows needed.
    """

    __tablename__ = "ttft_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    warm: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    requests: Mapped[int] = mapped_column(BigInteger)


class InteractionRow(Base):
    """How many cells an interaction has completed in; its row lock orders concurrent writers."""

    __tablename__ = "interactions"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    interaction_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    cells: Mapped[int] = mapped_column(Integer)


class InteractionCellRow(Base):
    """A (tenant, interaction, model, hour) with at least one completed attempt.

    Completed interactions of any period = the cells in it (summed from usage_hours) minus
    the repeats of interactions with several cells there, which only ``spans`` cells can be.
    Priced completed interactions are counted the same way, over the ``priced`` cells.
    """

    __tablename__ = "interaction_cells"
    __table_args__ = (
        # Covering (from 0016): the repeats of spanning interactions are counted from the
        # index alone, not from heap pages scattered through the table (55,000 of them for
        # a month at 10,000,000 records).
        partial_index(
            "ix_interaction_cells_spans_hour",
            "hour",
            "tenant_id",
            "model",
            "interaction_id",
            "priced",
            where="spans",
        ),
    )

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    interaction_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    spans: Mapped[bool] = mapped_column(Boolean, default=False)
    # A priced attempt completed the interaction in this cell (added by 0006).
    priced: Mapped[bool] = mapped_column(Boolean, server_default=false())


class DeploymentHourRow(TokenSumColumns, Base):
    """Per UTC hour × tenant × model × deployment × price entry × endpoint: the attempts'
    tokens and cost (added by 0016; gateway/db/writer/deployments.py)."""

    __tablename__ = "deployment_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    price_id: Mapped[str] = mapped_column(String(300), primary_key=True)  # '' unpriced
    endpoint: Mapped[str] = mapped_column(String(40), primary_key=True)  # '' not known
    cost_total: Mapped[Decimal] = mapped_column(Money())


# -- statement lines (added by 0019; gateway/db/writer/lines.py) -------------------------

LINE_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite numbers INTEGER keys alone
LINE_KEYS = ("tenant_id", "day", "model", "endpoint", "price_id", "rate_class", "usage_source")


class StatementLineRow(TokenSumColumns, CostColumns, Base):
    """One line of a tenant's statement, kept by the writer: per UTC day × tenant × model ×
    endpoint × price entry × rate set × usage source, the attempts' sums and the distinct
    interactions a completed attempt of the line completed (counted through
    ``StatementCellRow``). A month's statement reads about a hundred of these instead of
    every request (840,000 at 10,000,000 records)."""

    __tablename__ = "statement_lines"
    __table_args__ = (UniqueConstraint(*LINE_KEYS, name="uq_statement_lines_key"),)

    id: Mapped[int] = mapped_column(LINE_ID, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    day: Mapped[date] = mapped_column(Date)
    model: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(40))  # '' not known
    price_id: Mapped[str] = mapped_column(String(300))  # '' unpriced
    rate_class: Mapped[str] = mapped_column(String(32))  # '' not known
    usage_source: Mapped[str] = mapped_column(String(16))
    cache_write_1h_tokens: Mapped[int] = mapped_column(BigInteger)
    completed_interactions: Mapped[int] = mapped_column(BigInteger)


class StatementCellRow(Base):
    """An interaction that a completed attempt of a statement line completed: the line's
    ``completed_interactions`` counts each once, whatever the number of its attempts."""

    __tablename__ = "statement_cells"

    line_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    interaction_id: Mapped[str] = mapped_column(String(200), primary_key=True)


# -- prefix breakers and replica reconciliation (added by 0010) ----------------------------


class BreakHourRow(Base):
    """Per UTC hour × tenant × model × price entry × rate set × break offset × early: the
    requests whose prompt broke there, and the tokens they could not reuse."""

    __tablename__ = "break_hours"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    price_id: Mapped[str] = mapped_column(String(300), primary_key=True)  # '' unpriced
    rate_class: Mapped[str] = mapped_column(String(32), primary_key=True)  # '' not known
    break_tokens: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    early: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    lost_tokens: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)


class ReplicaSampleRow(Base):
    """One reading of a replica's own counters (its /metrics, summed over engines and
    models), taken by one gateway worker (``sampler``) at ``sampled_at``."""

    __tablename__ = "replica_samples"

    upstream: Mapped[str] = mapped_column(String(500), primary_key=True)
    sampler: Mapped[str] = mapped_column(String(200), primary_key=True)
    sampled_at: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    prefix_cache_queries: Mapped[int] = mapped_column(BigInteger)
    prefix_cache_hits: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    generation_tokens: Mapped[int] = mapped_column(BigInteger)


# -- spend control (added by 0012): budgets, rate limits, and their shared counters -------


class ScopedRow:
    """The columns of a limit set on a scope (gateway/budgets.py Scope): a tenant, or one of
    its keys; ``tenant_id`` is the scope's tenant either way."""

    # Mixin columns would follow the class's own: -1 keeps them first, as the tables were made.
    id: Mapped[str] = mapped_column(String(64), primary_key=True, sort_order=-1)
    scope_kind: Mapped[str] = mapped_column(String(16), sort_order=-1)
    scope_value: Mapped[str] = mapped_column(String(300), sort_order=-1)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True, sort_order=-1)
    key_id: Mapped[str | None] = mapped_column(String(64), default=None, sort_order=-1)


class BudgetRow(ScopedRow, Base):
    """A limit on what one scope may spend per period (gateway/budgets.py Budget)."""

    __tablename__ = "budgets"

    limit: Mapped[Decimal] = mapped_column(Money())
    period: Mapped[str] = mapped_column(String(8))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    alert_at: Mapped[str] = mapped_column(String(200))  # comma-separated shares of the limit
    webhook: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class BudgetCounterRow(Base):
    """One budget's spend in one period (and, for interaction budgets, one interaction):
    settled spend and what admitted requests hold reserved, both charged in one UPDATE."""

    __tablename__ = "budget_counters"

    budget_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)  # '' or interaction
    period_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    spent: Mapped[Decimal] = mapped_column(Money())
    reserved: Mapped[Decimal] = mapped_column(Money())


class BudgetHoldRow(Base):
    """What one admitted request holds reserved on one counter, until it is settled; a
    hold whose gateway died is swept after ``expires_at`` and its amount returned."""

    __tablename__ = "budget_holds"
    __table_args__ = (Index("ix_budget_holds_expires_at", "expires_at"),)

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    budget_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(200))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    amount: Mapped[Decimal] = mapped_column(Money())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class BudgetAlertRow(Base):
    """One threshold crossed by one budget in one period: made once (its key), then
    delivered to the webhook; ``status`` pending | delivered | failed | no_webhook."""

    __tablename__ = "budget_alerts"

    budget_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    threshold: Mapped[str] = mapped_column(String(16), primary_key=True)
    spent: Mapped[Decimal] = mapped_column(Money())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)


class RateLimitRow(ScopedRow, Base):
    """Requests and tokens per minute on a tenant or key (NULL: no cap on that one)."""

    __tablename__ = "rate_limits"

    requests_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RateWindowRow(Base):
    """One rate limit's count in one UTC minute: requests admitted, tokens recorded."""

    __tablename__ = "rate_windows"

    limit_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)


# -- price corrections (added by 0014): adjustments beside the records, never over them ---


class PriceAdjustmentRow(Base):
    """What one correction of a price entry changes of one tenant's UTC day of one model.

    ``billed`` is what those requests were billed before it (their stored costs plus the
    earlier adjustments of the same entry, tenant, day and model), ``corrected`` what the
    corrected rates make of them, ``delta`` the difference. The records are never touched.
    ``correction_key`` names the correction (the entry and its corrected rates).
    """

    __tablename__ = "price_adjustments"
    __table_args__ = (
        Index("ix_price_adjustments_tenant_day", "tenant_id", "day"),
        Index("ix_price_adjustments_entry", "price_id", "tenant_id", "day", "model"),
        Index("ix_price_adjustments_key", "correction_key"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    correction_key: Mapped[str] = mapped_column(String(64))
    price_id: Mapped[str] = mapped_column(String(300))
    tenant_id: Mapped[str] = mapped_column(String(64))
    day: Mapped[date] = mapped_column(Date)
    model: Mapped[str] = mapped_column(String(200))
    requests: Mapped[int] = mapped_column(BigInteger)
    billed: Mapped[Decimal] = mapped_column(Money())
    corrected: Mapped[Decimal] = mapped_column(Money())
    delta: Mapped[Decimal] = mapped_column(Money())
    # The corrected base rates, JSON with Decimal strings (Rates.to_mapping()).
    corrected_rates: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


# -- the cost to serve a self-hosted model (added by 0015) ---------------------------------


class GpuCostRow(Base):
    """What running one vLLM deployment costs per UTC hour, from ``effective_from`` (a whole
    hour) until the deployment's next entry: ``per_replica_hour`` × ``replicas``.

    ``prefill_decode_ratio`` is the weight of one output token in GPU time, counted in
    uncached prompt tokens prefilled (gateway/db/figures/serving_cost.py). Entries are never
    edited: a cost that changes gets a new ``effective_from``.
    """

    __tablename__ = "gpu_costs"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    per_replica_hour: Mapped[Decimal] = mapped_column(Money())
    replicas: Mapped[int] = mapped_column(Integer)
    # Exact to 9 places like money (SQLite keeps NUMERIC as binary floats).
    prefill_decode_ratio: Mapped[Decimal] = mapped_column(Money())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
