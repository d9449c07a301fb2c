"""The dashboard's sign-in rules without a server: throttle, clients, comparison, settings."""

from __future__ import annotations

import hashlib
import hmac
import threading

import pytest
from pydantic import ValidationError

from dashboard import access, launcher
from dashboard.throttle import FORGET_S, MAX_LOCKOUT_S, Throttle, client_of
from gateway.config import Settings

PRODUCTION = {
    "environment": "production",
    "secret": "a-real-server-secret-for-tests-0f3a",
    "admin_token": "a-real-admin-token-for-tests-77c1",
}


def never() -> bool:
    raise AssertionError("a locked client's guess must not be compared")


def test_five_failures_lock_a_client_for_sixty_seconds_even_with_the_right_password() -> None:
    throttle = Throttle(max_failures=5, lockout_s=60)
    verdicts = [throttle.attempt("a", lambda: False, now=100.0 + i) for i in range(5)]
    assert [v.locked_for_s for v in verdicts] == [0, 0, 0, 0, 60]
    assert not any(v.accepted for v in verdicts)
    refused = throttle.attempt("a", never, now=163.5)  # the right password, 0.5 s early
    assert (refused.accepted, refused.locked_for_s, refused.compared) == (False, 0.5, False)
    assert all(v.compared for v in verdicts)
    assert throttle.locked_for("a", now=164.0) == 0
    assert throttle.attempt("a", lambda: True, now=164.0).accepted


def test_each_failure_after_a_lock_doubles_it_up_to_an_hour() -> None:
    throttle = Throttle(max_failures=5, lockout_s=60)
    now = 0.0
    for _ in range(4):
        throttle.attempt("a", lambda: False, now=now)
    locks = []
    for _ in range(8):
        verdict = throttle.attempt("a", lambda: False, now=now)
        locks.append(verdict.locked_for_s)
        now += verdict.locked_for_s
    assert locks == [60, 120, 240, 480, 960, 1920, MAX_LOCKOUT_S, MAX_LOCKOUT_S]


def test_clients_are_counted_apart_and_a_success_forgets_the_failures() -> None:
    throttle = Throttle(max_failures=2, lockout_s=60)
    throttle.attempt("a", lambda: False, now=0)
    assert throttle.attempt("a", lambda: False, now=1).locked_for_s == 60
    assert throttle.attempt("b", lambda: True, now=1).accepted  # another client
    throttle.attempt("b", lambda: False, now=2)
    assert throttle.attempt("b", lambda: True, now=3).accepted
    assert throttle.attempt("b", lambda: False, now=4).locked_for_s == 0  # count restarted


def test_a_day_without_failures_forgets_a_client() -> None:
    throttle = Throttle(max_failures=2, lockout_s=60)
    throttle.attempt("a", lambda: False, now=0)
    assert throttle.attempt("a", lambda: False, now=FORGET_S + 1).locked_for_s == 0


def test_the_throttle_holds_at_most_max_clients_oldest_failure_forgotten_first() -> None:
    throttle = Throttle(max_failures=1, lockout_s=60, max_clients=3)
    for n, client in enumerate("abcd"):
        throttle.attempt(client, lambda: False, now=n)
    assert [throttle.locked_for(c, now=4) for c in "abcd"] == [0, 57, 58, 59]


def test_concurrent_guesses_from_one_client_are_compared_at_most_max_failures_times() -> None:
    """Sessions submitting at the same moment cannot slip guesses past the count."""
    throttle = Throttle(max_failures=5, lockout_s=60)
    compared: list[int] = []
    start = threading.Barrier(40)

    def wrong() -> bool:
        compared.append(1)
        return False

    def guess() -> None:
        start.wait()
        throttle.attempt("a", wrong, now=0)

    threads = [threading.Thread(target=guess) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(compared) == 5


@pytest.mark.parametrize(
    ("address", "client"),
    [
        (None, "local"),  # Streamlit reports loopback peers as no address
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:fffe", "2001:db8:1:2::/64"),  # one host's block
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ],
)
def test_a_client_is_its_address_or_its_ipv6_block(address: str | None, client: str) -> None:
    assert client_of(address) == client


def test_the_password_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest on SHA-256 digests: equal lengths, whatever the guess's length."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def noting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", noting)
    assert access.password_matches("correct-horse", "correct-horse")
    assert not access.password_matches("correct-hors", "correct-horse")
    assert not access.password_matches("x" * 1000, "correct-horse")
    digest = hashlib.sha256(b"correct-horse").digest()
    assert [b for _, b in compared] == [digest] * 3
    assert [a for a, _ in compared] == [
        digest,
        hashlib.sha256(b"correct-hors").digest(),
        hashlib.sha256(b"x" * 1000).digest(),
    ]


@pytest.mark.parametrize(
    ("password", "refusal"),
    [
        (None, "KVGATE_DASHBOARD_PASSWORD must be set in production"),
        ("change-me", "KVGATE_DASHBOARD_PASSWORD must be set in production"),
        ("Secret", "KVGATE_DASHBOARD_PASSWORD must be set in production"),
        ("short-11-ch", "KVGATE_DASHBOARD_PASSWORD must be at least 12 characters"),
        ("twelve-chars", None),
    ],
)
def test_production_refuses_a_dashboard_without_a_real_password(
    password: str | None, refusal: str | None
) -> None:
    settings = Settings(**PRODUCTION, dashboard_password=password)  # type: ignore[arg-type]
    found = settings.dashboard_refusal()
    assert (found if found is None else found[: len(refusal or "")]) == refusal


def test_development_runs_an_open_dashboard() -> None:
    assert Settings(environment="development", dashboard_password=None).dashboard_refusal() is None


def test_trusted_proxies_are_addresses_or_networks_comma_separated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVGATE_DASHBOARD_TRUSTED_PROXIES", "10.0.0.0/8, 127.0.0.1,::1")
    trusted = Settings().dashboard_trusted_proxies
    assert trusted == ("10.0.0.0/8", "127.0.0.1/32", "::1/128")
    assert launcher.environment({"PATH": "/bin"}, trusted) == {
        "PATH": "/bin",
        "FORWARDED_ALLOW_IPS": "10.0.0.0/8,127.0.0.1/32,::1/128",
    }
    monkeypatch.setenv("KVGATE_DASHBOARD_TRUSTED_PROXIES", "")
    assert Settings().dashboard_trusted_proxies == ()
    monkeypatch.setenv("KVGATE_DASHBOARD_TRUSTED_PROXIES", "proxy.internal")
    with pytest.raises(ValidationError, match="not an address or network"):
        Settings()


def test_by_default_no_forwarded_for_header_is_believed() -> None:
    """uvicorn trusts loopback's X-Forwarded-For unless told: the dashboard tells it none."""
    assert launcher.environment({"FORWARDED_ALLOW_IPS": "*"}, ()) == {"FORWARDED_ALLOW_IPS": ""}


@pytest.mark.parametrize(
    ("url", "path"),
    [
        (None, None),
        ("http://127.0.0.1:8501/", ""),
        ("http://127.0.0.1:8501/requests", "requests"),
        ("https://ops.example/kvgate/tenants/?x=1", "tenants"),
    ],
)
def test_the_page_a_url_names_is_its_last_path_segment(url: str | None, path: str | None) -> None:
    assert access.page_path(url) == path
