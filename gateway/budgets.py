"""Spend control's values: budgets and rate limits, their scopes, and calendar periods.

    Scope       what a budget or limit applies to: tenant:NAME, key:KEY_ID,
                interaction:TENANT (each interaction of the tenant on its own),
                user:TENANT/USER (the requests naming that end user: OpenAI's ``user``,
                Anthropic's ``metadata.user_id``), tag:TENANT/KEY=VALUE (the requests
                carrying that tag: X-Kvgate-Tags or ``metadata``)
    Period      day | week | month | total, turning over at midnight in the budget's zone
    Budget      a limit (Decimal, the prices' currency) per period on one scope
    RateLimit   requests and tokens per minute on a tenant or key

Pure: no database, no clock (every moment is passed in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.errors import InvalidRequest

MAX_LIMIT = Decimal(10**9)  # Numeric(18, 9) holds less than 10^9 whole units
MAX_SCOPE_CHARS = 300  # the scope_value column
DEFAULT_ALERTS = (Decimal("0.5"), Decimal("0.8"), Decimal("1.0"))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # a total budget's one period starts here
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)


class ScopeKind(StrEnum):
    TENANT = "tenant"
    KEY = "key"
    INTERACTION = "interaction"
    USER = "user"
    TAG = "tag"


MAX_TAG_CHARS = 64  # as attribution checks a request's tags
TAG_KEY_FORBIDDEN = frozenset('=,"\\')
LIMITABLE = (ScopeKind.TENANT, ScopeKind.KEY)  # rate limits apply to these


class Period(StrEnum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    TOTAL = "total"


@dataclass(frozen=True, slots=True)
class Scope:
    """What a budget applies to: ``kind`` and the value as written (a name, a key id)."""

    kind: ScopeKind
    value: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    @property
    def tenant_name(self) -> str | None:
        """The tenant the scope names (not for keys, which name their id)."""
        if self.kind is ScopeKind.KEY:
            return None
        return self.value.split("/", 1)[0]

    @property
    def end_user(self) -> str | None:
        """The end user a ``user:TENANT/USER`` scope names (None for other kinds)."""
        return self.value.split("/", 1)[1] if self.kind is ScopeKind.USER else None

    @property
    def tag(self) -> tuple[str, str] | None:
        """The (key, value) a ``tag:TENANT/KEY=VALUE`` scope names (None for other kinds)."""
        if self.kind is not ScopeKind.TAG:
            return None
        key, _, value = self.value.split("/", 1)[1].partition("=")
        return key, value

    def matches(self, end_user: str | None, tags: tuple[tuple[str, str], ...]) -> bool:
        """Whether a request of the scope's tenant (or key) with this end user and these tags
        is charged: always, but for user and tag scopes, which need theirs."""
        if self.kind is ScopeKind.USER:
            return end_user is not None and end_user == self.end_user
        if self.kind is ScopeKind.TAG:
            return self.tag in tags
        return True


def parse_scope(text: str, *, allowed: tuple[ScopeKind, ...] = tuple(ScopeKind)) -> Scope:
    """``tenant:NAME``, ``key:KEY_ID``, ``interaction:TENANT``, ``user:TENANT/USER`` or
    ``tag:TENANT/KEY=VALUE``; anything else, or a kind not ``allowed``, is a 400."""
    kind_text, sep, value = text.partition(":")
    try:
        kind = ScopeKind(kind_text)
    except ValueError:
        kind = None
    if kind is None or not sep or not value.strip():
        raise InvalidRequest(
            f"scope must be tenant:NAME, key:KEY_ID, interaction:TENANT, user:TENANT/USER or "
            f"tag:TENANT/KEY=VALUE, not {text!r}",
            param="scope",
        )
    if kind not in allowed:
        names = ", ".join(f"{k}:" for k in allowed)
        raise InvalidRequest(f"scope must be one of {names} here, not {text!r}", param="scope")
    value = value.strip()
    if len(value) > MAX_SCOPE_CHARS or not value.isprintable():
        raise InvalidRequest(
            f"a scope's name is at most {MAX_SCOPE_CHARS} printable characters", param="scope"
        )
    if kind in (ScopeKind.USER, ScopeKind.TAG):
        _check_attributed(kind, value, text)
    return Scope(kind, value)


def _check_attributed(kind: ScopeKind, value: str, text: str) -> None:
    """A user scope names its tenant and an end user; a tag scope its tenant and one tag,
    whose key and value follow the rules a request's tags are held to."""
    tenant, _, rest = value.partition("/")
    form = "user:TENANT/USER" if kind is ScopeKind.USER else "tag:TENANT/KEY=VALUE"
    if not tenant.strip() or not rest.strip() or rest != rest.strip():
        raise InvalidRequest(f"a {kind} scope is {form}, not {text!r}", param="scope")
    if kind is ScopeKind.USER:
        return
    key, equals, tag = rest.partition("=")
    if (
        not equals
        or not 0 < len(key) <= MAX_TAG_CHARS
        or key != key.strip()
        or TAG_KEY_FORBIDDEN & set(key)
        or not 0 < len(tag) <= MAX_TAG_CHARS
        or tag != tag.strip()
        or "," in tag
    ):
        raise InvalidRequest(
            f"a tag scope is {form}: a key of 1 to {MAX_TAG_CHARS} characters without '=', "
            f"',', '\"' or '\\' and a value of 1 to {MAX_TAG_CHARS} without ',', "
            f"not {text!r}",
            param="scope",
        )


def parse_limit(text: str | Decimal) -> Decimal:
    """A budget's limit: a non-negative decimal amount (nano-dollar precision)."""
    try:
        amount = Decimal(str(text))
    except InvalidOperation:
        raise InvalidRequest(
            f"limit must be a decimal amount, not {text!r}", param="limit"
        ) from None
    if (
        not amount.is_finite()
        or not 0 <= amount < MAX_LIMIT
        or amount != amount.quantize(Decimal("1e-9"))
    ):
        raise InvalidRequest(
            f"limit must be an amount from 0 to under {MAX_LIMIT} with at most 9 decimals, "
            f"not {text!r}",
            param="limit",
        )
    return amount


def parse_webhook(url: str | None) -> str | None:
    """An alert webhook: an http(s) URL of at most 2,000 printable characters."""
    if url is None:
        return None
    if (
        not url.startswith(("http://", "https://"))
        or len(url) > 2000
        or not url.isprintable()
        or " " in url
    ):
        raise InvalidRequest(
            f"webhook must be an http:// or https:// URL, not {url!r}", param="webhook"
        )
    return url


def parse_zone(name: str) -> ZoneInfo:
    """An IANA time zone (``Europe/Paris``); unknown ones are a 400."""
    if len(name) > 64 or not name.isprintable():
        raise InvalidRequest(f"unknown time zone {name!r}", param="timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidRequest(f"unknown time zone {name!r}", param="timezone") from None


def parse_alerts(text: str | list[Decimal] | tuple[Decimal, ...]) -> tuple[Decimal, ...]:
    """Alert thresholds as shares of the limit (``0.5,0.8,1.0``): each in (0, 1], sorted."""
    parts = text.split(",") if isinstance(text, str) else [str(v) for v in text]
    try:
        values = sorted({Decimal(p.strip()) for p in parts if p.strip()})
    except InvalidOperation:
        raise InvalidRequest(f"alert thresholds must be decimals, not {text!r}") from None
    if any(
        not v.is_finite() or not (0 < v <= 1) or v != v.quantize(Decimal("1e-6")) for v in values
    ):
        raise InvalidRequest(
            "alert thresholds must each be above 0 and at most 1", param="alert_at"
        )
    return tuple(values)


def period_bounds(period: Period, zone: ZoneInfo, at: datetime) -> tuple[datetime, datetime]:
    """The period holding ``at``: [start, end) in UTC, cut at midnight in ``zone`` (days,
    Monday-started weeks, calendar months; DST-aware: a day may be 23 or 25 hours)."""
    if period is Period.TOTAL:
        return EPOCH, FOREVER
    local = at.astimezone(zone)
    day = local.date()
    if period is Period.DAY:
        first, after = day, day + timedelta(days=1)
    elif period is Period.WEEK:
        first = day - timedelta(days=day.weekday())
        after = first + timedelta(days=7)
    else:
        first = day.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    start = datetime(first.year, first.month, first.day, tzinfo=zone).astimezone(UTC)
    end = datetime(after.year, after.month, after.day, tzinfo=zone).astimezone(UTC)
    return start, end


@dataclass(frozen=True, slots=True)
class Budget:
    """A limit on what one scope may spend per period."""

    id: str
    scope: Scope
    tenant_id: str  # the tenant the scope belongs to
    limit: Decimal
    period: Period
    timezone: str = "UTC"
    alert_at: tuple[Decimal, ...] = DEFAULT_ALERTS
    webhook: str | None = None
    key_id: str | None = None  # key scopes: the key

    def bounds(self, at: datetime) -> tuple[datetime, datetime]:
        """The budget's period holding ``at``."""
        return period_bounds(self.period, ZoneInfo(self.timezone), at)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Requests and tokens (prompt + output) per minute on a tenant or key (None: no cap)."""

    id: str
    scope: Scope
    tenant_id: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    key_id: str | None = None


@dataclass(frozen=True, slots=True)
class Rules:
    """Every budget and rate limit a gateway enforces, indexed by what a request matches."""

    budgets: tuple[Budget, ...] = ()
    limits: tuple[RateLimit, ...] = ()
    # The tenants with any budget or limit: every other tenant's request is free at once.
    governed: frozenset[str] = field(init=False, default=frozenset())
    # Each tenant's budgets; each (tenant, key)'s limits, as asked (admission asks per
    # request; the rules are replaced, not changed, so these never go stale).
    _budgets: dict[str, tuple[Budget, ...]] = field(init=False, repr=False, compare=False)
    _limits: dict[tuple[str, str], tuple[RateLimit, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        tenants = {b.tenant_id for b in self.budgets} | {r.tenant_id for r in self.limits}
        object.__setattr__(self, "governed", frozenset(tenants))
        budgets: dict[str, list[Budget]] = {}
        for budget in self.budgets:
            budgets.setdefault(budget.tenant_id, []).append(budget)
        object.__setattr__(self, "_budgets", {t: tuple(b) for t, b in budgets.items()})
        object.__setattr__(self, "_limits", {})

    def budgets_for(
        self,
        tenant_id: str,
        key_id: str,
        end_user: str | None = None,
        tags: tuple[tuple[str, str], ...] = (),
    ) -> tuple[Budget, ...]:
        """The budgets a request of this tenant with this key, end user and tags is charged to."""
        return tuple(
            b
            for b in self._budgets.get(tenant_id, ())
            if (b.key_id is None or b.key_id == key_id) and b.scope.matches(end_user, tags)
        )

    def limits_for(self, tenant_id: str, key_id: str) -> tuple[RateLimit, ...]:
        """The rate limits a request of this tenant with this key counts against."""
        found = self._limits.get((tenant_id, key_id))
        if found is None:
            if len(self._limits) > 10_000:  # keys come and go: the index stays small
                self._limits.clear()
            found = self._limits[(tenant_id, key_id)] = tuple(
                r
                for r in self.limits
                if r.tenant_id == tenant_id and (r.key_id is None or r.key_id == key_id)
            )
        return found


def crossed(
    thresholds: tuple[Decimal, ...], limit: Decimal, before: Decimal, after: Decimal
) -> tuple[Decimal, ...]:
    """The thresholds a spend moving from ``before`` to ``after`` reached (>= share x limit)."""
    return tuple(t for t in thresholds if before < t * limit <= after)


def reset_text(end: datetime) -> str:
    """When a period ends, for messages: ISO 8601 UTC, or never for a total budget."""
    return "never (a total budget)" if end >= FOREVER else end.isoformat().replace("+00:00", "Z")
