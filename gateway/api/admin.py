"""/v1/admin: operator endpoints, behind the admin token."""

from __future__ import annotations

from datetime import date
from typing import Literal

from fastapi import APIRouter, Response

from gateway import billing
from gateway.api.billing import download_headers
from gateway.api.deps import AdminDep, SessionDep
from gateway.api.openapi import ADMIN_TOKEN, errors
from gateway.db import crud

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=errors(400, 401, 404))


@router.get(
    "/statement",
    openapi_extra={"security": [{ADMIN_TOKEN: []}]},
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
)
def statement(
    _: AdminDep,
    session: SessionDep,
    tenant: str,
    start: date,
    end: date,
    format: Literal["json", "csv"] = "json",
) -> Response:
    """Any tenant's statement, by tenant name."""
    row = crud.get_tenant(session, name=tenant)
    body, media_type = billing.render(
        billing.build_statement(session, tenant=row, start=start, end=end), format
    )
    return Response(
        body, media_type=media_type, headers=download_headers(row.name, start, end, format)
    )
