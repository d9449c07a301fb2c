"""docker-compose.yml agrees with the CLI and the config schema (no Docker engine runs here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import typer
import yaml

from gateway.cli import app
from gateway.config import DeploymentsFile, Settings

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
CLI = typer.main.get_command(app)


def parse(args: list[str]) -> Any:
    """Parse a kvgate command line with the real CLI, without running it."""
    command: Any = CLI
    ctx = CLI.context_class(CLI, info_name="kvgate")
    rest = list(args)
    # Typer's click may not be the installed click, so groups are known by what they do.
    while hasattr(command, "resolve_command"):
        name, found, rest = command.resolve_command(ctx, rest)
        assert found is not None and name is not None, args
        command = found
        ctx = command.context_class(command, info_name=name, parent=ctx)
    parsed: Any = command.make_context(ctx.info_name, rest, parent=ctx.parent)
    return parsed


def config(name: str, models_dir: Path | None = None) -> DeploymentsFile:
    """A compose config, validated; /models (a volume in compose) may stand at ``models_dir``."""
    content = COMPOSE["configs"][name]["content"]
    if models_dir is not None:
        content = content.replace("/models/", f"{models_dir}/")
    return DeploymentsFile.model_validate(yaml.safe_load(content))


def published(service: str) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in SERVICES[service].get("ports", [])}


def test_the_expected_services_and_profiles_exist() -> None:
    assert {
        "postgres",
        "migrate",
        "gateway",
        "gateway-2",
        "balancer",
        "dashboard",
        "sim-1",
        "sim-2",
        "vllm-1",
        "vllm-2",
    } <= set(SERVICES)
    assert SERVICES["sim-1"]["profiles"] == ["sim"] and SERVICES["vllm-1"]["profiles"] == ["gpu"]


@pytest.mark.parametrize("service", ["gateway", "gateway-2", "dashboard", "sim-1", "sim-2"])
def test_kvgate_commands_parse_with_the_real_cli(service: str) -> None:
    ctx = parse(SERVICES[service]["command"])
    assert ctx.command.name == SERVICES[service]["command"][0]
    assert ctx.params["host"] == "0.0.0.0"
    if service == "dashboard":
        assert published(service) == {ctx.params["port"]}
    if service.startswith("gateway"):
        assert SERVICES[service]["expose"] == [str(ctx.params["port"])]


def test_two_gateway_instances_sit_behind_the_balancer_each_with_its_own_journal() -> None:
    """The balancer proxies TCP to both instances' ports and is the one published; the
    instances run the same command and configuration, each with its own journal."""
    conf = COMPOSE["configs"]["balancer"]["content"]
    targets = re.findall(r"server (\S+):(\d+);", conf)
    assert sorted(targets) == [("gateway", "8000"), ("gateway-2", "8000")]
    for host, port in targets:
        assert parse(SERVICES[host]["command"]).params["port"] == int(port)
        assert published(host) == set()
    listen = int(re.search(r"listen (\d+);", conf).group(1))  # type: ignore[union-attr]
    assert published("balancer") == {listen} == {8000}
    assert "stream {" in conf and "http {" not in conf  # L4: no HTTP buffering in between
    one, two = SERVICES["gateway"], SERVICES["gateway-2"]
    assert (one["command"], one["environment"], one["configs"]) == (
        two["command"],
        two["environment"],
        two["configs"],
    )
    journal = one["environment"]["KVGATE_JOURNAL_DIR"]
    mounts = [
        {v.split(":")[0] for v in s["volumes"] if v.endswith(":" + journal)} for s in (one, two)
    ]
    assert mounts == [{"journal"}, {"journal-2"}]


def test_both_fleets_route_in_exact_mode_so_the_instances_agree(tmp_path: Path) -> None:
    model_dir = tmp_path / "llama-3.1-8b-instruct"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text("{}")
    for name in ("kvgate-sim", "kvgate-gpu"):
        (model,) = config(name, models_dir=tmp_path).models
        assert len(model.kv_events) == len(model.replicas), name
    (model,) = config("kvgate-sim").models
    for url, events in zip(model.replica_urls, model.kv_events, strict=True):
        host = urlparse(url).hostname
        ctx = parse(SERVICES[host]["command"])
        assert urlparse(events.endpoint).port == urlparse(ctx.params["kv_events_endpoint"]).port
        assert (
            urlparse(events.replay_endpoint).port
            == urlparse(ctx.params["kv_events_replay_endpoint"]).port
        )
        assert events.topic == ctx.params["kv_events_topic"]


def test_the_migrate_step_runs_real_commands() -> None:
    script = SERVICES["migrate"]["entrypoint"][-1]
    for command in script.split("&&"):
        words = command.split()
        assert words[0] == "kvgate"
        parse(words[1:])


def test_sim_config_points_at_the_sim_services_ports() -> None:
    (model,) = config("kvgate-sim").models
    for url in model.replica_urls:
        host, port = urlparse(url).hostname, urlparse(url).port
        ctx = parse(SERVICES[host]["command"])
        assert ctx.params["port"] == port and ctx.params["host"] == "0.0.0.0"
        assert ctx.params["model"] == model.served_name


def test_gpu_config_points_at_vllm_with_prefix_caching_and_token_details(tmp_path: Path) -> None:
    model_dir = tmp_path / "llama-3.1-8b-instruct"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text("{}")
    (model,) = config("kvgate-gpu", models_dir=tmp_path).models
    for url in model.replica_urls:
        host, port = urlparse(url).hostname, urlparse(url).port
        args = SERVICES[host]["command"]
        assert f"--port={port}" in args
        assert "--enable-prefix-caching" in args and "--enable-prompt-tokens-details" in args
        assert f"--served-model-name={model.served_name}" in args
        (events_arg,) = [a for a in args if a.startswith("--kv-events-config=")]
        events = json.loads(events_arg.split("=", 1)[1])
        assert events["enable_kv_cache_events"] is True
        (wired,) = [k for k in model.kv_events if urlparse(k.endpoint).hostname == host]
        assert urlparse(wired.endpoint).port == urlparse(events["endpoint"]).port
        assert urlparse(wired.replay_endpoint).port == urlparse(events["replay_endpoint"]).port
        assert wired.topic == events["topic"]
        served_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--model="))
        assert model.tokenizer == served_dir.replace("/models/", f"{tmp_path}/")
        assert any(v.endswith(":/models:ro") for v in SERVICES["gateway"]["volumes"])


def test_gateway_reads_the_fleet_file_compose_mounts_and_the_postgres_it_starts() -> None:
    env = SERVICES["gateway"]["environment"]
    targets = {c["target"] for c in SERVICES["gateway"]["configs"]}
    assert env["KVGATE_CONFIG"].replace("${KVGATE_FLEET:-sim}", "sim") in targets
    assert env["KVGATE_CONFIG"].replace("${KVGATE_FLEET:-sim}", "gpu") in targets
    database = urlparse(env["KVGATE_DATABASE_URL"])
    postgres = SERVICES["postgres"]["environment"]
    assert database.hostname == "postgres"
    assert (database.username, database.password, database.path.lstrip("/")) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
        postgres["POSTGRES_DB"],
    )
    assert env["KVGATE_ENVIRONMENT"] == "production"


def test_the_image_copies_every_package_the_cli_imports() -> None:
    dockerfile = SERVICES["gateway"]["build"]["dockerfile_inline"]
    for folder in ("gateway", "pricing", "dashboard", "migrations"):
        assert f"COPY {folder} {folder}" in dockerfile


def test_the_dashboard_gets_a_password_the_user_must_set_and_the_rest_does_not() -> None:
    """Compose stops with a message when KVGATE_DASHBOARD_PASSWORD is unset (`:?`): no
    committed password, and a production dashboard never starts open."""
    env = SERVICES["dashboard"]["environment"]
    assert env["KVGATE_ENVIRONMENT"] == "production"
    assert env["KVGATE_DATABASE_URL"] == SERVICES["gateway"]["environment"]["KVGATE_DATABASE_URL"]
    assert env["KVGATE_DASHBOARD_PASSWORD"].startswith("${KVGATE_DASHBOARD_PASSWORD:?")
    assert env["KVGATE_DASHBOARD_PASSWORD"].endswith("}")
    assert env["KVGATE_DASHBOARD_TRUSTED_PROXIES"] == "${KVGATE_DASHBOARD_TRUSTED_PROXIES:-}"
    for name, service in SERVICES.items():
        if name != "dashboard":
            assert "KVGATE_DASHBOARD_PASSWORD" not in service.get("environment", {}), name


def interpolate(value: str, given: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}`` (an error if unset)."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.group(1), match.group(2), match.group(3) or ""
        if given.get(name):
            return given[name]
        if kind == "?":
            raise LookupError(f"required variable {name} is missing a value: {rest}")
        return rest

    return re.sub(r"\$\{(\w+)(?::([?-])([^}]*))?\}", one, value)


def test_compose_refuses_without_a_dashboard_password_and_starts_the_dashboard_with_one() -> None:
    """What compose would hand the dashboard, interpolated as compose does, passes
    `kvgate dashboard`'s check; without the user's password compose stops first."""
    user = {"KVGATE_SECRET": "s" * 32, "KVGATE_ADMIN_TOKEN": "a-real-admin-token"}
    environment = SERVICES["dashboard"]["environment"]
    with pytest.raises(LookupError, match="KVGATE_DASHBOARD_PASSWORD"):
        [interpolate(v, user) for v in environment.values()]
    user["KVGATE_DASHBOARD_PASSWORD"] = "a-long-dashboard-password"
    env = {k: interpolate(v, user) for k, v in environment.items()}
    fields = {k.removeprefix("KVGATE_").lower(): v for k, v in env.items() if k != "KVGATE_CONFIG"}
    settings = Settings(**fields)
    assert settings.environment == "production" and settings.dashboard_refusal() is None
    assert settings.dashboard_trusted_proxies == ()
