"""The sign-in form under Streamlit's AppTest: what is drawn before, during and after."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import access
from tests.dashboard.conftest import APP, World

PASSWORD = "s3cret-dashboard"


@pytest.fixture(autouse=True)
def fresh_throttle() -> Iterator[None]:
    """The throttle is one per process, as in a server: each test starts with none."""
    access.throttle.clear()
    yield
    access.throttle.clear()


def signed_out(world: World, monkeypatch: pytest.MonkeyPatch, **settings: str) -> AppTest:
    monkeypatch.setenv("KVGATE_DATABASE_URL", world.url)
    monkeypatch.setenv("KVGATE_DASHBOARD_PASSWORD", PASSWORD)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    app = AppTest.from_file(str(APP), default_timeout=30).run()
    assert not app.exception, app.exception
    return app


def submit(app: AppTest, password: str) -> AppTest:
    app.text_input(key=access.PASSWORD).set_value(password)
    return app.button[0].click().run()


def shown(app: AppTest) -> bytes:
    """Every element drawn, serialized (main and sidebar)."""

    def walk(node: Any) -> Iterator[bytes]:
        proto = getattr(node, "proto", None)
        if proto is not None:
            yield proto.SerializeToString()
        for child in getattr(node, "children", {}).values():
            yield from walk(child)

    return b"".join(part for root in (app.main, app.sidebar) for part in walk(root))


def test_before_sign_in_only_the_form_is_drawn_on_every_page(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No sidebar, no tenant, no figure; a page asked for by path runs no page script."""
    app = signed_out(world, monkeypatch)
    for page in (None, "tenants", "breakers", "requests"):
        if page is not None:
            app.switch_page(f"screens/{page}.py").run()
        assert not app.exception, app.exception
        assert not app.sidebar.children and not app.metric and not app.dataframe
        assert [t.value for t in app.main.title] == ["kvgate"]
        assert [b"acme" in shown(app), b"bravo" in shown(app)] == [False, False]
    submit(app, PASSWORD)  # on the page the path named
    assert [t.value for t in app.main.title] == ["Requests"] and b"acme" in shown(app)


def test_a_wrong_password_is_refused_and_the_right_one_signs_in_until_sign_out(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = signed_out(world, monkeypatch)
    submit(app, "wrong")
    assert [e.value for e in app.error] == [access.WRONG]
    assert not app.sidebar.children
    submit(app, PASSWORD)
    assert app.title[0].value == "Overview" and app.metric
    app.sidebar.button(key="kvgate.sign_out").click().run()
    assert [t.value for t in app.main.title] == ["kvgate"] and not app.sidebar.children


def test_after_max_failures_even_the_right_password_is_refused(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = signed_out(world, monkeypatch, KVGATE_DASHBOARD_MAX_FAILURES="2")
    submit(app, "wrong")
    assert [e.value for e in app.error] == [access.WRONG]
    submit(app, "wrong again")
    assert [e.value for e in app.error] == [access.locked_message(60)]
    submit(app, PASSWORD)
    assert app.error[0].value.startswith("Too many failed sign-ins from your address")
    assert not app.metric and not app.sidebar.children
    # A new session from the same client (AppTest: no address) is locked as well.
    again = signed_out(world, monkeypatch, KVGATE_DASHBOARD_MAX_FAILURES="2")
    assert again.error[0].value.startswith("Too many failed sign-ins from your address")
    submit(again, PASSWORD)
    assert not again.metric and not again.sidebar.children


def test_an_empty_submission_is_not_counted(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    app = signed_out(world, monkeypatch, KVGATE_DASHBOARD_MAX_FAILURES="1")
    app.button[0].click().run()
    assert not app.error
    submit(app, PASSWORD)
    assert app.title[0].value == "Overview"


def test_a_production_app_started_by_hand_without_a_password_shows_only_the_refusal(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`streamlit run dashboard/app.py` bypasses `kvgate dashboard`'s check: same rule."""
    monkeypatch.setenv("KVGATE_DATABASE_URL", world.url)
    monkeypatch.delenv("KVGATE_DASHBOARD_PASSWORD", raising=False)
    monkeypatch.setenv("KVGATE_ENVIRONMENT", "production")
    monkeypatch.setenv("KVGATE_SECRET", "a-real-server-secret-for-tests-0f3a")
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "a-real-admin-token-for-tests-77c1")
    app = AppTest.from_file(str(APP), default_timeout=30).run()
    assert [e.value for e in app.error] == [
        "KVGATE_DASHBOARD_PASSWORD must be set in production: the dashboard shows every "
        "tenant's figures"
    ]
    assert not app.sidebar.children and not app.text_input and b"acme" not in shown(app)


def test_a_lockout_reads_in_whole_seconds_whatever_the_clocks_rounding() -> None:
    now = 999.9  # a monotonic reading for which (now + 60) - now > 60
    assert (now + 60.0) - now > 60.0
    assert access.locked_message((now + 60.0) - now) == access.locked_message(60)
    assert access.locked_message(60.0) == (
        "Too many failed sign-ins from your address: try again in 60 s."
    )
    assert access.locked_message(59.2) == access.locked_message(60)
    assert access.locked_message(60.2).endswith("in 61 s.")
