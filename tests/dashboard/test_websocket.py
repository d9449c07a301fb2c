"""`kvgate dashboard` spoken to directly over Streamlit's websocket, as an attacker would.

Each test starts the real server (tests/dashboard/served.py) and talks to it with
tests/dashboard/wire.py: Streamlit's own protobufs, no browser. The tenants' names and
spend are the data looked for in every byte the server sends.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dashboard import access
from dashboard.launcher import OPEN_WARNING
from tests.dashboard.served import PASSWORD, PRODUCTION, TENANTS, dashboard
from tests.dashboard.wire import PAGES, Session, found

pytestmark = pytest.mark.e2e

LOCKED = "Too many failed sign-ins from your address: try again in"


def test_no_page_reaches_a_raw_websocket_before_sign_in_and_every_page_after(
    tmp_path: Path,
) -> None:
    with dashboard(tmp_path, **PRODUCTION, KVGATE_DASHBOARD_PASSWORD=PASSWORD) as served:
        before = []
        for page in PAGES:  # a new session per URL path, as a browser opening it
            with Session(served.url) as fresh:
                before.append(fresh.run(page))
                assert found(before[-1].raw, served.secrets) == [], page
                assert fresh.run(page).widget_id("text_input", "Dashboard password")
        with Session(served.url) as session:
            for page in PAGES:  # one session walking every path, then a wrong password
                before.append(session.run(page))
                assert found(before[-1].raw, served.secrets) == [], page
            refused = session.sign_in("not-the-password", page="tenants")
            assert refused.errors() == [access.WRONG]
            assert found(refused.raw, served.secrets) == []
            messages = sum(len(run.messages) for run in before)
            print(f"\nbefore sign-in: {messages} messages, {sum(len(r.raw) for r in before)} B")
            # The same probe sees the data once signed in: it would see a leak.
            signed_in = session.sign_in(PASSWORD)
            assert found(signed_in.raw, served.secrets[:3]) == [*TENANTS, served.total_spend]
            after = [session.run(page) for page in PAGES]
            for page, run in zip(PAGES, after, strict=True):
                assert found(run.raw, TENANTS) == list(TENANTS), page
            print(f"signed in: {sum(len(r.raw) for r in after)} B, every page naming both")
            shown = served.tenant_spend[TENANTS[1]]  # the page opens on the first by name
            assert found(session.run("tenants").raw, [shown]) == [shown]
        with Session(served.url) as other:  # signing in is per session
            assert found(other.run("tenants").raw, served.secrets) == []


def test_without_a_password_in_development_the_same_probe_sees_every_page(
    tmp_path: Path,
) -> None:
    """The gate removed: the probe above finds the data, and the server says it is open."""
    with dashboard(tmp_path) as served, Session(served.url) as session:
        overview = session.run("")
        assert found(overview.raw, served.secrets[:3]) == [*TENANTS, served.total_spend]
        for page in PAGES[1:]:
            assert found(session.run(page).raw, TENANTS) == list(TENANTS), page
        assert f"warning: {OPEN_WARNING}" in served.proc.output()


def test_failed_sign_ins_lock_the_client_across_new_sessions_and_forged_addresses(
    tmp_path: Path,
) -> None:
    """5 failures lock the client's address; new sessions, X-Forwarded-For headers and
    the right password change nothing until the lock ends; the next failure doubles it."""
    lockout = 6.0  # long enough that twelve sessions at once end inside it on a busy CI machine
    settings = {
        **PRODUCTION,
        "KVGATE_DASHBOARD_PASSWORD": PASSWORD,
        "KVGATE_DASHBOARD_LOCKOUT_S": str(lockout),
    }
    with dashboard(tmp_path, **settings) as served:

        def guess(n: int, password: str = "wrong-guess") -> list[str]:
            forged = {"X-Forwarded-For": f"198.51.100.{n}"}  # believed from no one
            with Session(served.url, headers=forged) as session:
                run = session.sign_in(password)
                errors = run.errors()
                assert errors == [] or found(run.raw, served.secrets) == []
                return errors

        def accepted_after(start: float) -> float:
            """Seconds from ``start`` until the right password is let in."""
            while guess(99, PASSWORD) != []:
                assert time.monotonic() - start < lockout + 30, "never let in again"
                time.sleep(0.1)
            return time.monotonic() - start

        # Twelve sessions at once, each guessing once: five are compared, all refused.
        with ThreadPoolExecutor(12) as pool:
            answers = [a[0] for a in pool.map(guess, range(12))]
        assert answers.count(access.WRONG) == 4
        assert sum(a.startswith(LOCKED) for a in answers) == 8
        assert all(guess(20 + n, PASSWORD)[0].startswith(LOCKED) for n in range(3))
        accepted_after(time.monotonic())

        # One at a time, timed: the lock starts no earlier than the fifth guess is sent.
        for n in range(4):
            assert guess(40 + n) == [access.WRONG]
        fifth = time.monotonic()
        assert guess(44) == [access.locked_message(lockout)]
        waited = accepted_after(fifth)
        print(f"\n5 failures, then the right password refused until {waited:.2f} s later")
        assert lockout <= waited < lockout + 10

        for n in range(5):  # the success forgot the client: five more lock it again
            last = guess(60 + n)
        assert last == [access.locked_message(lockout)]
        time.sleep(lockout + 0.1)
        assert guess(70) == [access.locked_message(2 * lockout)]  # the next failure doubles
        # One log line per guess looked at (5 + 5 + 5 + 1), all for the one real client.
        log = served.proc.output()
        assert log.count("failed dashboard sign-in from local") == 16 and "198.51.100" not in log


def test_behind_a_trusted_proxy_each_forwarded_client_is_throttled_apart(
    tmp_path: Path,
) -> None:
    settings = {
        **PRODUCTION,
        "KVGATE_DASHBOARD_PASSWORD": PASSWORD,
        "KVGATE_DASHBOARD_TRUSTED_PROXIES": "127.0.0.1",
    }
    with dashboard(tmp_path, **settings) as served:

        def attempt(client: str, password: str) -> list[str]:
            with Session(served.url, headers={"X-Forwarded-For": client}) as session:
                return session.sign_in(password).errors()

        answers = [attempt("203.0.113.9", "wrong-guess") for _ in range(6)]
        assert answers[3] == [access.WRONG] and answers[5][0].startswith(LOCKED)
        assert attempt("203.0.113.9", PASSWORD)[0].startswith(LOCKED)
        assert attempt("203.0.113.10", PASSWORD) == []  # another client behind the proxy
