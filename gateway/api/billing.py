"""/v1/billing: a tenant's own statement and prefix breakers, and nothing of anyone else's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from gateway import billing
from gateway.api.deps import SessionDep, TenantDep
from gateway.api.openapi import TENANT_KEY, errors
from gateway.db.figures.breaks import document, positions
from gateway.db.figures.spend import Scope
from gateway.db.models import TenantRow
from gateway.db.session import Session
from gateway.db.statements import tenant_by_id
from gateway.errors import NotFound

StatementFormat = Literal["json", "csv"]
GroupBy = Annotated[
    str | None,
    Query(description="Split the lines by end user (`end_user`) or by a tag's value (`tag:KEY`)."),
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StatementQuery:
    """What the statement endpoints are asked: UTC days start..end (both included), the
    format and the grouping of the lines (keyword-only: a subclass's own come first)."""

    start: date
    end: date
    format: StatementFormat = "json"
    group_by: GroupBy = None


@dataclass(frozen=True, slots=True)
class NamedStatementQuery(StatementQuery):
    """A statement query for the tenant it names (the operator's; its first parameter)."""

    tenant: str


# The statement endpoints' query parameters, read into one value.
StatementDep = Annotated[StatementQuery, Depends()]
NamedStatementDep = Annotated[NamedStatementQuery, Depends()]

# The statement endpoints' answer: the file as JSON or CSV, named for a download.
STATEMENT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/csv": {"schema": {"type": "string"}}}}
}

router = APIRouter(prefix="/v1/billing", tags=["billing"], responses=errors(400, 401, 404))


@router.get(
    "/statement",
    openapi_extra={"security": [{TENANT_KEY: []}]},
    responses=STATEMENT_RESPONSES,
)
def statement(tenant: TenantDep, session: SessionDep, query: StatementDep) -> Response:
    """The calling tenant's statement for UTC days start..end (both included)."""
    row = tenant_by_id(session, tenant.tenant_id)
    if row is None:
        raise NotFound("tenant not found")
    return statement_response(session, row, query)


@router.get("/breakers", openapi_extra={"security": [{TENANT_KEY: []}]})
def breakers(
    tenant: TenantDep, session: SessionDep, since: date, model: str | None = None
) -> list[dict[str, Any]]:
    """Where the calling tenant's prompts broke their interaction's cache reuse since the UTC
    day ``since``, most tokens lost first (with the text around each, if it opted in)."""
    found = positions(
        session,
        Scope(
            datetime.combine(since, datetime.min.time(), tzinfo=UTC),
            datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1),
            (tenant.tenant_id,),
            (model,) if model else (),
        ),
    )
    return [document(p, tenant.tenant_name) for p in found]


def statement_response(session: Session, tenant: TenantRow, query: StatementQuery) -> Response:
    """A tenant's statement as a download, in JSON or CSV."""
    start, end, format = query.start, query.end, query.format
    body, media_type = billing.render(
        billing.build_statement(
            session, tenant=tenant, start=start, end=end, group_by=query.group_by
        ),
        format,
    )
    return Response(
        body, media_type=media_type, headers=download_headers(tenant.name, start, end, format)
    )


def download_headers(name: str, start: date, end: date, fmt: str) -> dict[str, str]:
    """Headers that save a statement as ``kvgate-statement-NAME-START-END.FMT``."""
    filename = f"kvgate-statement-{name}-{start}-{end}.{fmt}"
    return {"content-disposition": f'attachment; filename="{filename}"'}
