"""/v1/admin: operator endpoints, behind the admin token."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.billing import STATEMENT_RESPONSES, NamedStatementDep, statement_response
from gateway.api.deps import AdminDep, SessionDep
from gateway.api.openapi import ADMIN_TOKEN, errors
from gateway.db import changes, crud
from gateway.db.session import Session

log = logging.getLogger("kvgate.admin")
router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=errors(400, 401, 404))
SECURED: dict[str, Any] = {"security": [{ADMIN_TOKEN: []}]}
T = TypeVar("T")


@router.get(
    "/statement",
    openapi_extra=SECURED,
    responses=STATEMENT_RESPONSES,
)
def statement(_: AdminDep, session: SessionDep, query: NamedStatementDep) -> Response:
    """Any tenant's statement, by tenant name."""
    row = crud.get_tenant(session, name=query.tenant)
    return statement_response(session, row, query)


class NewKey(BaseModel):
    """Whose key to issue."""

    model_config = ConfigDict(extra="forbid")
    tenant: str = Field(min_length=1, max_length=200, description="The tenant's name.")


class IssuedKey(BaseModel):
    """A new key: ``key`` is shown here once and stored only hashed."""

    id: str
    key: str
    tenant: str
    created: datetime


class Key(BaseModel):
    """A key as the operator sees it: never the key itself, nor its hash."""

    id: str
    tenant: str
    created: datetime
    revoked: datetime | None


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Key]


def publish(request: Request, work: Callable[[Session], T]) -> T:
    """Run a change in the database and return once every gateway applies it; log the
    gateway processes that did not confirm it in time."""
    result, published = changes.publish(request.app.state.sessions, work)
    if published.unconfirmed:
        log.warning(
            "key change not confirmed within %.0f s by: %s (they apply it when they do)",
            changes.CONFIRM_TIMEOUT_S,
            ", ".join(published.unconfirmed),
        )
    return result


def _key(info: crud.KeyInfo) -> Key:
    return Key(id=info.id, tenant=info.tenant, created=info.created_at, revoked=info.revoked_at)


@router.post("/keys", status_code=201, openapi_extra=SECURED)
def create_key(_: AdminDep, request: Request, body: NewKey) -> IssuedKey:
    """Issue a key for a tenant; it works on every gateway once this returns."""
    issued = publish(request, lambda session: crud.create_key(session, tenant_name=body.tenant))
    return IssuedKey(id=issued.id, key=issued.key, tenant=issued.tenant, created=issued.created_at)


@router.get("/keys", openapi_extra=SECURED)
def list_keys(_: AdminDep, session: SessionDep, tenant: str | None = None) -> KeyList:
    """Every key (or one tenant's), oldest first, revoked ones included."""
    return KeyList(data=[_key(info) for info in crud.list_keys(session, tenant_name=tenant)])


@router.delete("/keys/{key_id}", openapi_extra=SECURED)
def revoke_key(_: AdminDep, request: Request, key_id: str) -> Key:
    """Revoke a key; refused on every gateway once this returns (again: no change)."""
    info = publish(request, lambda session: crud.revoke_key(session, key_id=key_id))
    request.app.state.keys.revoke_local(key_id)
    return _key(info)
