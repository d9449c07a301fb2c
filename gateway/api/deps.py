"""FastAPI dependency aliases for the routers that use them (billing, admin)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.auth import Principal, admin_token_matches
from gateway.db.session import Session
from gateway.errors import AuthenticationFailed

# The key is documented as a bearer security scheme (api/openapi.py), not as a parameter.
Authorization = Annotated[str | None, Header(include_in_schema=False)]


async def _tenant(request: Request, authorization: Authorization = None) -> Principal:
    principal: Principal = await request.app.state.keys.authenticate(authorization)
    return principal


def _admin(request: Request, authorization: Authorization = None) -> None:
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
