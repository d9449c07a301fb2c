"""Settings (environment, prefix ``KVGATE_``) and the deployments file (``kvgate.yaml``).

One ``Settings`` object is built at the edge (CLI) and passed into ``create_app``;
nothing else reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    HttpUrl,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.accounting.journal import SyncMode

PLACEHOLDER_SECRETS = {"", "change-me", "changeme", "dev-secret", "secret", "kvgate-dev-secret"}
DEV_SECRET = "kvgate-dev-secret"
DEV_ADMIN_TOKEN = "kvgate-dev-admin"


class ConfigError(ValueError):
    """A settings value or deployments file that cannot be used."""


class KvEvents(BaseModel):
    """Where one replica publishes vLLM's KV events (its ``--kv-events-config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The replica's PUB socket, e.g. tcp://10.0.0.5:5557 (the replica binds tcp://*:5557).
    endpoint: str = Field(min_length=1)
    # Its replay socket (``replay_endpoint``): lost events are recovered from it.
    replay_endpoint: str | None = None
    topic: str = ""


class Deployment(BaseModel):
    """One model name clients use, and where its requests go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    backend: Literal["vllm"] = "vllm"
    replicas: tuple[HttpUrl, ...] = Field(min_length=1)
    # The price-book model this deployment bills as (default: its own name).
    price_model: str | None = None
    # The model name the replicas know (default: the deployment name).
    upstream_model: str | None = None
    # Routing: kv-aware (prefix affinity against load), round-robin, least-loaded,
    # random or session; tunables are kv-aware's (gateway/routing/policy.py Tunables).
    policy: str = "kv-aware"
    tunables: dict[str, float] = Field(default_factory=dict)
    # The replicas' KV block size and cache capacity in blocks (the index's bound).
    block_size: int = Field(default=16, ge=1)
    capacity_blocks: int = Field(default=2048, ge=1)
    # How prompts become blocks: none = text chunks (approximate); "kvgate-sim" = the
    # simulator's tokens; a model directory (tokenizer.json, chat template) = vLLM's own
    # tokens and block hashes, with block size and hash algorithm read from the replicas.
    tokenizer: str | None = None
    # One entry per replica, in order: holdings known exactly from its KV events.
    kv_events: tuple[KvEvents, ...] = ()
    # The replicas' PYTHONHASHSEED, if they run with one set (it seeds vLLM's block hashes).
    hash_seed: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _known_policy_and_tunables(self) -> Deployment:
        from gateway.routing.policy import POLICIES, Tunables
        from gateway.routing.prompts import SIM_TOKENIZER

        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        try:
            Tunables(**self.tunables)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ValueError(f"unknown tunable: {exc}") from None
        if (
            self.tokenizer not in (None, SIM_TOKENIZER)
            and not (Path(self.tokenizer) / "tokenizer.json").is_file()
        ):
            raise ValueError(
                f"tokenizer must be {SIM_TOKENIZER!r}, a model directory with a "
                f"tokenizer.json, or absent; {self.tokenizer!r} is none of these"
            )
        if self.kv_events and len(self.kv_events) != len(self.replicas):
            raise ValueError("kv_events needs one entry per replica, in the replicas' order")
        return self

    @property
    def bills_as(self) -> str:
        return self.price_model or self.name

    @property
    def served_name(self) -> str:
        return self.upstream_model or self.name

    @property
    def replica_urls(self) -> tuple[str, ...]:
        return tuple(str(url).rstrip("/") for url in self.replicas)


def anthropic_family(litellm_model: str) -> bool:
    """Models that accept Anthropic's ``cache_control`` marks (direct, Bedrock, Vertex)."""
    lowered = litellm_model.lower()
    return lowered.startswith("anthropic/") or "claude" in lowered


class ProviderTarget(BaseModel):
    """One hosted model behind a litellm deployment: the primary, or one of its fallbacks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    litellm_model: str = Field(min_length=1)
    # Name of the environment variable holding the key; Settings reads it, nothing else.
    api_key_env: str | None = None
    api_base: HttpUrl | None = None
    # The price-book model this target bills as (default: its litellm model string).
    price_model: str | None = None
    # Anthropic-family only: mark the stable prefix (tools, system) for the provider's cache.
    cache_control: bool = False
    cache_ttl: Literal["5m", "1h"] = "5m"
    timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _cache_control_only_where_accepted(self) -> ProviderTarget:
        if self.cache_control and not anthropic_family(self.litellm_model):
            raise ValueError(
                f"cache_control is for Anthropic-family models, not {self.litellm_model!r}"
            )
        return self

    @property
    def bills_as(self) -> str:
        return self.price_model or self.litellm_model

    @property
    def base_url(self) -> str | None:
        return None if self.api_base is None else str(self.api_base).rstrip("/")


class ProviderDeployment(ProviderTarget):
    """A model name served by hosted providers through litellm, tried in order."""

    name: str = Field(min_length=1)
    backend: Literal["litellm"]
    fallbacks: tuple[ProviderTarget, ...] = ()

    @property
    def targets(self) -> tuple[ProviderTarget, ...]:
        """The primary first, then each fallback: one attempt each."""
        primary = ProviderTarget.model_validate(
            self.model_dump(include=set(ProviderTarget.model_fields))
        )
        return (primary, *self.fallbacks)


def _backend(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("backend", "vllm"))
    return str(getattr(value, "backend", "vllm"))


AnyDeployment = Annotated[
    Annotated[Deployment, Tag("vllm")] | Annotated[ProviderDeployment, Tag("litellm")],
    Discriminator(_backend),
]


class DeploymentsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[AnyDeployment, ...] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> DeploymentsFile:
        names = [d.name for d in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique: {duplicates}")
        return self


def load_deployments(path: Path | None) -> tuple[Deployment | ProviderDeployment, ...]:
    """Read and validate the deployments file; no file means no models."""
    if path is None:
        return ()
    try:
        document: Any = yaml.safe_load(path.read_text()) or {}
        return DeploymentsFile.model_validate(document).models
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


class Settings(BaseSettings):
    """Everything the gateway is configured with."""

    # Secrets stay out of validation errors and reprs (both end up in logs).
    model_config = SettingsConfigDict(
        env_prefix="KVGATE_", extra="ignore", hide_input_in_errors=True
    )

    environment: Literal["development", "production"] = "development"
    database_url: str = Field(default="sqlite:///kvgate.db", repr=False)  # may hold a password
    config: Path | None = None
    secret: str = Field(default=DEV_SECRET, repr=False)
    admin_token: str = Field(default=DEV_ADMIN_TOKEN, repr=False)
    journal_dir: Path = Path("var/journal")
    # always | background | never (see gateway/accounting/journal.py); true/false read as
    # always/never, as in earlier releases.
    journal_sync: SyncMode = SyncMode.BACKGROUND
    # background mode: the longest a written record waits for its flush (a machine crash
    # can lose the records of this last window; a gateway crash loses none).
    journal_sync_interval_ms: float = Field(default=10.0, gt=0, le=1000)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # What one client may hold before it is served, all before authentication
    # (gateway/connections.py): its request head within header_timeout_s of connecting and
    # max_header_bytes (else 408 / 431), its body within body_timeout_s of the head (else
    # 408); past max_connections open connections per worker, a new one is answered 503.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    max_header_bytes: int = Field(default=32 * 1024, ge=1024)
    max_connections: int = Field(default=10_000, ge=1)
    recorder_batch_size: int = Field(default=500, ge=1)
    # Write to the database from a child process, keeping that work off the event loop's
    # core and GIL (false: a thread of the gateway process).
    recorder_process: bool = True
    recorder_flush_interval_s: float = Field(default=0.2, gt=0)
    # When the journal cannot be written: refuse requests (503) rather than serve unrecorded.
    refuse_when_unrecordable: bool = True
    key_refresh_s: float = Field(default=5.0, gt=0)
    price_refresh_s: float = Field(default=30.0, gt=0)
    health_interval_s: float = Field(default=5.0, gt=0)
    # How often each replica's /metrics is read (load, and its KV block size and hashing).
    load_interval_s: float = Field(default=1.0, gt=0)
    log_level: str = "info"
    # Worker processes of `kvgate serve` (each its own event loop on its own core; they
    # share routing knowledge, the journal directory and the metrics, see routing/peers.py).
    workers: int = Field(default=1, ge=1, le=64)
    # Asked for by the dashboard when set; unset (the demo) means no password.
    dashboard_password: str | None = Field(default=None, repr=False)

    @field_validator("journal_sync", mode="before")
    @classmethod
    def _journal_sync_from_bool(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
            value = value.strip().lower() in ("true", "1")
        if isinstance(value, bool):
            return SyncMode.ALWAYS if value else SyncMode.NEVER
        return value

    @model_validator(mode="after")
    def _no_placeholder_secrets_in_production(self) -> Settings:
        if self.environment == "production":
            if self.secret in PLACEHOLDER_SECRETS or len(self.secret) < 16:
                raise ValueError("KVGATE_SECRET must be set to a real secret in production")
            if self.admin_token in PLACEHOLDER_SECRETS | {DEV_ADMIN_TOKEN}:
                raise ValueError("KVGATE_ADMIN_TOKEN must be set in production")
        return self

    def deployments(self) -> tuple[Deployment | ProviderDeployment, ...]:
        return load_deployments(self.config)

    def provider_keys(self) -> dict[str, str]:
        """The API keys that litellm deployments name by environment variable, read here.

        A variable that is named but not set is left out: the provider answers 401, and
        that attempt is recorded like any other failure.
        """
        names = {
            target.api_key_env
            for d in self.deployments()
            if isinstance(d, ProviderDeployment)
            for target in d.targets
            if target.api_key_env
        }
        return {name: os.environ[name] for name in sorted(names) if name in os.environ}
