"""A tenant signs in to the dashboard with one of its API keys and sees its own data alone.

The known world has two tenants, acme and bravo. Signed in with acme's key, every page
a tenant is given draws acme's figures; bravo's name, its interaction and its requests
never reach the session's elements, a look-up of bravo's request is "not found", the
pages of fleet-wide figures (routing, reconciliation) are not there, and revoking the key
signs the session out on its next run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import access
from gateway.db import crud
from tests.dashboard.conftest import APP, FIRST_DAY, LAST_DAY, World
from tests.dashboard.test_sign_in import PASSWORD, shown

TENANT_PAGES = ("overview", "tenants", "models", "requests", "breakers")


@pytest.fixture(autouse=True)
def fresh_throttle() -> Iterator[None]:
    access.throttle.clear()
    yield
    access.throttle.clear()


def key_of(world: World, tenant: str) -> crud.IssuedKey:
    with world.sessions() as session, session.begin():
        return crud.create_key(session, tenant_name=tenant)


def signed_in_with_key(world: World, monkeypatch: pytest.MonkeyPatch, key: str) -> AppTest:
    monkeypatch.setenv("KVGATE_DATABASE_URL", world.url)
    monkeypatch.setenv("KVGATE_DASHBOARD_PASSWORD", PASSWORD)
    app = AppTest.from_file(str(APP), default_timeout=30).run()
    app.text_input(key=access.API_KEY).set_value(key)
    app.button[0].click().run()
    assert not app.exception, app.exception
    return app


def period(app: AppTest) -> AppTest:
    app.date_input(key="period").set_value((FIRST_DAY, LAST_DAY))
    return app.run()


def test_a_tenant_key_signs_in_to_that_tenants_figures_alone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = key_of(world, "acme")
    app = period(signed_in_with_key(world, monkeypatch, issued.key))
    assert app.title[0].value == "Overview" and app.metric
    sidebar = b"".join(e.proto.SerializeToString() for e in app.sidebar.caption)
    assert b"Signed in as tenant **acme**" in sidebar
    assert not any(m.key == "tenants" for m in app.sidebar.multiselect)
    for page in TENANT_PAGES:
        app.switch_page(f"screens/{page}.py").run()
        assert not app.exception, (page, app.exception)
        drawn = shown(app)
        assert b"bravo" not in drawn and world.b.encode() not in drawn, page
        assert b"i6" not in drawn and b"req_6" not in drawn, page  # bravo's request
    app.switch_page("screens/tenants.py").run()
    assert app.title[0].value == "Your figures"
    table = app.dataframe[0]
    assert list(table.value["tenant"]) == ["acme"]
    app.switch_page("screens/breakers.py").run()
    assert "Reconciliation with the replicas" not in [h.value for h in app.subheader]


def test_a_tenant_cannot_look_up_another_tenants_request_or_interaction(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = key_of(world, "acme")
    app = period(signed_in_with_key(world, monkeypatch, issued.key))
    app.switch_page("screens/requests.py").run()
    for wanted in ("req_6", "i6"):  # bravo's
        app.text_input(key="lookup").set_value(wanted).run()
        assert [w.value for w in app.warning] == [f"No request or interaction {wanted!r}."]
    app.text_input(key="lookup").set_value("req_4").run()  # acme's own retried conversation
    assert not app.warning
    assert [s.value for s in app.subheader] == ["Interaction conv"]


def test_routing_is_the_operators_page_alone(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica figures sum every tenant's traffic: a tenant's session has no such page."""
    issued = key_of(world, "acme")
    app = period(signed_in_with_key(world, monkeypatch, issued.key))
    with pytest.raises(ValueError, match="Could not find a navigation page") as missing:
        app.switch_page("screens/routing.py")
    registered = str(missing.value).partition("Known pages: ")[2]
    assert re.findall(r"screens/(\w+)\.py", registered) == list(TENANT_PAGES)


def test_a_revoked_key_signs_its_session_out_on_the_next_run(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = key_of(world, "acme")
    app = signed_in_with_key(world, monkeypatch, issued.key)
    assert app.title[0].value == "Overview"
    with world.sessions() as session, session.begin():
        crud.revoke_key(session, key_id=issued.id)
    app.run()
    assert [t.value for t in app.main.title] == ["kvgate"] and not app.sidebar.children
    again = signed_in_with_key(world, monkeypatch, issued.key)
    assert [e.value for e in again.error] == [access.WRONG_KEY]
    assert not again.sidebar.children


def test_a_wrong_key_is_refused_and_counted_like_a_wrong_password(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_DASHBOARD_MAX_FAILURES", "2")
    app = signed_in_with_key(world, monkeypatch, "kvg-not-a-key")
    assert [e.value for e in app.error] == [access.WRONG_KEY]
    issued = key_of(world, "acme")
    second = signed_in_with_key(world, monkeypatch, "kvg-still-not-a-key")
    assert second.error[0].value == access.locked_message(60)
    locked = signed_in_with_key(world, monkeypatch, issued.key)  # the right key, locked out
    assert locked.error[0].value.startswith("Too many failed sign-ins from your address")
    assert not locked.sidebar.children


def test_the_operators_password_still_sees_every_tenant(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_DATABASE_URL", world.url)
    monkeypatch.setenv("KVGATE_DASHBOARD_PASSWORD", PASSWORD)
    app = AppTest.from_file(str(APP), default_timeout=30).run()
    app.text_input(key=access.PASSWORD).set_value(PASSWORD)
    app = period(app.button[0].click().run())
    app.switch_page("screens/tenants.py").run()
    table = app.dataframe[0]
    assert sorted(table.value["tenant"]) == ["acme", "bravo"]
