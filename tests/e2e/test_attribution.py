"""Cost attribution end to end: end users and tags from the official client to the records
and the tenant's statement, split by end user and by tag; each tenant sees only its own."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import openai
import pytest

from gateway import billing
from tests.e2e.conftest import SOLO
from tests.e2e.test_gateway import client, messages, raw, rows
from tests.support.stack import Stack

pytestmark = pytest.mark.e2e


def statement(stack: Stack, tenant: str, group_by: str, fmt: str = "json") -> tuple[int, bytes]:
    today = datetime.now(UTC).date()
    status, _, body = raw(
        stack,
        f"/v1/billing/statement?start={today}&end={today}&group_by={group_by}&format={fmt}",
        headers={"Authorization": f"Bearer {stack.keys[tenant]}"},
    )
    return status, body


def test_end_users_and_tags_are_recorded_and_split_the_statement(stack: Stack) -> None:
    alpha, beta = client(stack, "alpha"), client(stack, "beta")
    sent = {
        "u1-search": alpha.chat.completions.with_raw_response.create(
            model=SOLO,
            messages=messages("attribution one"),
            max_tokens=3,
            user="user-1",
            extra_headers={"X-Kvgate-Tags": "team=search, env=prod"},
        ),
        "u2-ads": alpha.chat.completions.with_raw_response.create(
            model=SOLO,
            messages=messages("attribution two"),
            max_tokens=4,
            user="user-2",
            metadata={"team": "ads", "interaction_id": "attr-2"},
        ),
        # The header's value wins over metadata's for the same key.
        "none-search": alpha.chat.completions.with_raw_response.create(
            model=SOLO,
            messages=messages("attribution three"),
            max_tokens=2,
            metadata={"team": "ads"},
            extra_headers={"X-Kvgate-Tags": "team=search"},
        ),
        "beta-u1": beta.chat.completions.with_raw_response.create(
            model=SOLO, messages=messages("attribution four"), max_tokens=5, user="user-1"
        ),
    }
    by_name = {
        name: rows(stack, request_id=reply.headers["x-request-id"])[0]
        for name, reply in sent.items()
    }
    assert {n: (r.end_user, r.tags) for n, r in by_name.items()} == {
        "u1-search": ("user-1", {"env": "prod", "team": "search"}),
        "u2-ads": ("user-2", {"team": "ads"}),
        "none-search": (None, {"team": "search"}),
        "beta-u1": ("user-1", None),
    }
    assert by_name["u2-ads"].interaction_id == "attr-2"  # metadata's interaction id is no tag

    def lines(tenant: str, group_by: str) -> dict[str | None, tuple[int, Decimal]]:
        status, body = statement(stack, tenant, group_by)
        assert status == 200, body
        document = json.loads(body)
        assert document["group_by"] == group_by
        out: dict[str | None, tuple[int, Decimal]] = {}
        for line in document["line_items"]:
            if line["model"] == SOLO:
                count, cost = out.get(line["group"], (0, Decimal(0)))
                out[line["group"]] = (count + line["requests"], cost + Decimal(line["cost_total"]))
        return out

    def spent(*names: str) -> Decimal:
        return sum((by_name[n].cost_total for n in names), Decimal(0))

    users = lines("alpha", "end_user")
    assert users["user-1"] == (1, spent("u1-search"))
    assert users["user-2"] == (1, spent("u2-ads"))
    assert users[None][1] >= spent("none-search")  # other tests' requests have no end user
    teams = lines("alpha", "tag:team")
    assert teams["search"] == (2, spent("u1-search", "none-search"))
    assert teams["ads"] == (1, spent("u2-ads"))
    assert lines("alpha", "tag:env")["prod"] == (1, spent("u1-search"))
    # Beta's end user of the same name is beta's alone.
    assert lines("beta", "end_user")["user-1"] == (1, spent("beta-u1"))
    assert "search" not in lines("beta", "tag:team")
    # CSV: the group comes after the totals-only columns, before the adjustments' own.
    status, body = statement(stack, "alpha", "tag:team", "csv")
    table = list(csv.DictReader(io.StringIO(body.decode())))
    columns = list(table[0])
    assert status == 200 and columns == list(billing.CSV_COLUMNS)
    assert columns.index("group") + 1 == columns.index("endpoint")
    assert columns.index("endpoint") < columns.index("adjustment_total")
    assert sum(int(r["requests"]) for r in table if r["group"] == "search") == 2


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {"extra_headers": {"X-Kvgate-Tags": ",".join(f"k{n}=v" for n in range(11))}},
            "X-Kvgate-Tags",
            "a request has at most 10 tags (11 given)",
        ),
        (
            {"extra_headers": {"X-Kvgate-Tags": "team"}},
            "X-Kvgate-Tags",
            "X-Kvgate-Tags must be key=value pairs separated by ',' (got 'team')",
        ),
        (
            {"extra_headers": {"X-Kvgate-Tags": "team=" + "x" * 65}},
            "X-Kvgate-Tags",
            "tag 'team' must have a value of 1 to 64 printable characters without ','",
        ),
        (
            {"extra_headers": {"X-Kvgate-Tags": "k" * 65 + "=v"}},
            "X-Kvgate-Tags",
            f"tag key '{'k' * 65}' must be 1 to 64 printable characters without "
            """'=', ',', '"' or '\\'""",
        ),
        (
            {"metadata": {"team": 7}},
            "metadata.team",
            "tag 'team' must have a string value",
        ),
        (
            {"metadata": {f"k{n}": "v" for n in range(11)}},
            "metadata",
            "a request has at most 10 tags (11 given)",
        ),
        (
            {"user": "u" * 257},
            "user",
            "'user' must be at most 256 printable characters",
        ),
    ],
)
def test_attribution_beyond_its_bounds_is_a_400_naming_it(
    stack: Stack, extra: dict[str, object], param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(stack).chat.completions.create(
            model=SOLO,
            messages=messages("refused"),
            max_tokens=1,
            **extra,  # type: ignore[arg-type]
        )
    assert refused.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }


def test_a_statement_grouped_by_something_else_is_a_400(stack: Stack) -> None:
    for group_by in ("tenant", "tag:", "tag:a=b"):
        status, body = statement(stack, "alpha", group_by)
        assert status == 400, group_by
        assert json.loads(body)["error"]["param"] == "group_by"
