"""FastAPI dependency aliases for the routers that use them (billing, admin)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from gateway.auth import Principal, admin_token_matches
from gateway.errors import AuthenticationFailed


async def _tenant(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    principal: Principal = await request.app.state.keys.authenticate(authorization)
    return principal


def _admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    if not admin_token_matches(request.app.state.settings.admin_token, authorization):
        raise AuthenticationFailed(
            "admin endpoints need the admin token", code="invalid_admin_token"
        )


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


TenantDep = Annotated[Principal, Depends(_tenant)]
AdminDep = Annotated[None, Depends(_admin)]
SessionDep = Annotated[Session, Depends(_session)]
