"""Settings (environment, prefix ``KVGATE_``) and the deployments file (``kvgate.yaml``).

One ``Settings`` object is built at the edge (CLI) and passed into ``create_app``;
nothing else reads the environment.
"""

from __future__ import annotations

import ipaddress
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
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PLACEHOLDER_SECRETS = {"", "change-me", "changeme", "dev-secret", "secret", "kvgate-dev-secret"}
DEV_SECRET = "kvgate-dev-secret"
DEV_ADMIN_TOKEN = "kvgate-dev-admin"
DASHBOARD_PASSWORD_MIN_LENGTH = 12


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


# Routing's policy names (gateway/routing/policy.py POLICIES; a test keeps them equal).
Policy = Literal["kv-aware", "round-robin", "least-loaded", "random", "session"]
# The simulated replica's tokenizer (gateway/routing/prompts.py SIM_TOKENIZER).
SIM_TOKENIZER = "kvgate-sim"


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
    # random or session; tunables are kv-aware's (gateway/routing/policy.py Tunables),
    # checked when the gateway starts.
    policy: Policy = "kv-aware"
    tunables: dict[str, float] = Field(default_factory=dict)
    # The replicas' KV block size and cache capacity in blocks (the index's bound).
    block_size: int = Field(default=16, ge=1)
    capacity_blocks: int = Field(default=2048, ge=1)
    # Sequences each replica runs at once (its --max-num-seqs): a replica with all of them
    # taken is chosen only when all are. vLLM 0.32's own default is 256 on most GPUs
    # (1,024 on H100/H200-class ones, 128 per rank on CPU).
    max_num_seqs: int = Field(default=256, ge=1)
    # How prompts become blocks: none = text chunks (approximate); "kvgate-sim" = the
    # simulator's tokens; a model directory (tokenizer.json, chat template) = vLLM's own
    # tokens and block hashes, with block size and hash algorithm read from the replicas.
    tokenizer: str | None = None
    # One entry per replica, in order: holdings known exactly from its KV events.
    kv_events: tuple[KvEvents, ...] = ()
    # The replicas' PYTHONHASHSEED, if they run with one set (it seeds vLLM's block hashes).
    hash_seed: str | None = None
    # Cache tiers below GPU memory, in blocks per replica (vLLM's offloading connector's
    # host memory, then disk): the approximate index mirrors them; with KV events the
    # events name each block's tier. tier_weights: what a hit in each tier saves, as a
    # share of its prefill ("cpu", "storage"; gateway/routing/tiers.py has the defaults).
    cpu_blocks: int = Field(default=0, ge=0)
    disk_blocks: int = Field(default=0, ge=0)
    tier_weights: dict[str, float] = Field(default_factory=dict)
    # How long a placement on a replica with KV events is believed before they confirm it.
    prediction_ttl_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # The output cap sent upstream, for a request under a budget that gave no max_tokens:
    # what its reservation counts (gateway/serving/admission.py).
    default_max_tokens: int = Field(default=4096, ge=1)

    @field_validator("tokenizer")
    @classmethod
    def _known_tokenizer(cls, value: str | None) -> str | None:
        if value not in (None, SIM_TOKENIZER) and not (Path(value) / "tokenizer.json").is_file():
            raise ValueError(
                f"tokenizer must be {SIM_TOKENIZER!r}, a model directory with a "
                f"tokenizer.json, or absent; {value!r} is none of these"
            )
        return value

    @model_validator(mode="after")
    def _one_event_source_per_replica(self) -> Deployment:
        if self.kv_events and len(self.kv_events) != len(self.replicas):
            raise ValueError("kv_events needs one entry per replica, in the replicas' order")
        return self

    @property
    def bills_as(self) -> str:
        """The model its price entries are under: ``price_model``, else the name."""
        return self.price_model or self.name

    @property
    def served_name(self) -> str:
        """The model name sent to the replicas: ``upstream_model``, else the name."""
        return self.upstream_model or self.name

    @property
    def replica_urls(self) -> tuple[str, ...]:
        """The replicas' base URLs, without a trailing slash."""
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
    # How chat is served: "auto" goes straight over the provider's own OpenAI wire where it
    # speaks it (gateway/serving/passthrough.py), else through litellm; "litellm" always
    # through litellm (a provider whose wire drifts from OpenAI's in a way litellm mends).
    via: Literal["auto", "litellm"] = "auto"

    @model_validator(mode="after")
    def _cache_control_only_where_accepted(self) -> ProviderTarget:
        if self.cache_control and not anthropic_family(self.litellm_model):
            raise ValueError(
                f"cache_control is for Anthropic-family models, not {self.litellm_model!r}"
            )
        return self

    @property
    def bills_as(self) -> str:
        """The model its price entries are under: ``price_model``, else the litellm model."""
        return self.price_model or self.litellm_model

    @property
    def base_url(self) -> str | None:
        """``api_base`` without a trailing slash; None: the provider's own."""
        return None if self.api_base is None else str(self.api_base).rstrip("/")

    @property
    def provider(self) -> str:
        """The provider litellm's prefix names (``anthropic``, ``openai``…); '' without one."""
        prefix, slash, _ = self.litellm_model.partition("/")
        return prefix.lower() if slash else ""

    @property
    def provider_model(self) -> str:
        """The model name the provider knows: the litellm model without its prefix."""
        return self.litellm_model.partition("/")[2] or self.litellm_model


class ProviderDeployment(ProviderTarget):
    """A model name served by hosted providers through litellm, tried in order."""

    name: str = Field(min_length=1)
    backend: Literal["litellm"]
    fallbacks: tuple[ProviderTarget, ...] = ()
    default_max_tokens: int = Field(default=4096, ge=1)  # as for vLLM deployments

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
    journal_sync: Literal["always", "background", "never"] = "background"
    # background mode: the longest a written record waits for its flush (a machine crash
    # can lose the records of this last window; a gateway crash loses none).
    journal_sync_interval_ms: float = Field(default=10.0, gt=0, le=1000)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # What one client may hold before it is served, all before authentication
    # (gateway/server/connections.py): its request head within header_timeout_s of connecting and
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
    # The writer process's niceness: its batches yield the core to the serving loop at
    # once, so a request arriving mid-batch does not wait for it (the c=1 tail), while it
    # still gets its share of a saturated core (0: as the gateway). benchmarks/README.md.
    recorder_nice: int = Field(default=5, ge=0, le=19)
    # The collector's youngest-generation threshold, set once the app is built (Python's
    # 700 by default): at c=32 the objects of requests in flight, freed anyway when each
    # ends, trigger a collection every dozen requests; 10,000 removes most of that work
    # but makes each rare collection longer. Measured in benchmarks/README.md.
    gc_threshold: int = Field(default=700, ge=100)
    # When the journal cannot be written: refuse requests (503) rather than serve unrecorded.
    refuse_when_unrecordable: bool = True
    key_refresh_s: float = Field(default=5.0, gt=0)
    price_refresh_s: float = Field(default=30.0, gt=0)
    health_interval_s: float = Field(default=5.0, gt=0)
    # How often each replica's /metrics is read (load, and its KV block size and hashing).
    load_interval_s: float = Field(default=1.0, gt=0)
    # Prefix breakers: interactions whose latest request each worker keeps, per deployment
    # (8 bytes per prompt block each: 4 KB for an 8,000-token prompt in 16-token blocks).
    break_lru_size: int = Field(default=4096, ge=1, le=10_000_000)
    # Budgets: an admitted request's hold, renewed while it runs; one whose gateway died is
    # returned to its budget this long after its last renewal.
    budget_hold_ttl_s: float = Field(default=60.0, ge=1)
    # Reconciliation: how often each replica's counters are stored (replica_samples), and
    # the window over which the gateway compares them with its records (drift > 1 %: a
    # metric and a log line); samples older than replica_sample_days are deleted.
    replica_sample_s: float = Field(default=60.0, gt=0)
    reconcile_window_s: float = Field(default=3600.0, gt=0)
    replica_sample_days: int = Field(default=35, ge=1)
    # OpenTelemetry (gateway/accounting/spans.py): a span per attempt, OTLP over
    # HTTP/protobuf to this collector (its base URL, or its /v1/traces URL); off when unset.
    otlp_endpoint: str | None = None
    otlp_export_interval_ms: float = Field(default=1000.0, gt=0, le=60_000)
    log_level: str = "info"
    # Worker processes of `kvgate serve` (each its own event loop on its own core; they
    # share routing knowledge, the journal directory and the metrics, see routing/peers.py).
    workers: int = Field(default=1, ge=1, le=64)
    # Asked for by the dashboard when set. Unset is allowed in development only (the
    # demo): a production dashboard refuses to start without one (dashboard_refusal).
    dashboard_password: str | None = Field(default=None, repr=False)
    # Set by `kvgate serve --workers N` for its workers (prometheus_client's own variable):
    # every worker's metrics go there, and a scrape of any worker reports them all.
    prometheus_multiproc_dir: Path | None = Field(
        default=None, validation_alias="PROMETHEUS_MULTIPROC_DIR"
    )
    # Failed sign-ins from one client (address; IPv6 by /64) before it is locked out for
    # dashboard_lockout_s; each further failure doubles the lock, up to an hour.
    dashboard_max_failures: int = Field(default=5, ge=1, le=1000)
    dashboard_lockout_s: float = Field(default=60.0, gt=0, le=86_400)
    # Proxies (addresses or networks, comma-separated) whose X-Forwarded-For names the
    # dashboard's client; none by default, so the header is never believed.
    dashboard_trusted_proxies: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("journal_sync", mode="before")
    @classmethod
    def _journal_sync_from_bool(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
            value = value.strip().lower() in ("true", "1")
        if isinstance(value, bool):
            return "always" if value else "never"
        return value

    @field_validator("dashboard_trusted_proxies", mode="before")
    @classmethod
    def _proxy_networks(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            try:
                return tuple(str(ipaddress.ip_network(str(v), strict=False)) for v in value)
            except ValueError as exc:
                raise ValueError(f"not an address or network: {exc}") from None
        return value

    @model_validator(mode="after")
    def _no_placeholder_secrets_in_production(self) -> Settings:
        if self.environment == "production":
            if self.secret in PLACEHOLDER_SECRETS or len(self.secret) < 16:
                raise ValueError("KVGATE_SECRET must be set to a real secret in production")
            if self.admin_token in PLACEHOLDER_SECRETS | {DEV_ADMIN_TOKEN}:
                raise ValueError("KVGATE_ADMIN_TOKEN must be set in production")
        return self

    def dashboard_refusal(self) -> str | None:
        """Why the dashboard must not start with these settings; None when it may."""
        if self.environment != "production":
            return None
        password = self.dashboard_password
        if password is None or password.strip().lower() in PLACEHOLDER_SECRETS:
            return (
                "KVGATE_DASHBOARD_PASSWORD must be set in production: the dashboard "
                "shows every tenant's figures"
            )
        if len(password) < DASHBOARD_PASSWORD_MIN_LENGTH:
            return (
                f"KVGATE_DASHBOARD_PASSWORD must be at least "
                f"{DASHBOARD_PASSWORD_MIN_LENGTH} characters in production"
            )
        return None

    def deployments(self) -> tuple[Deployment | ProviderDeployment, ...]:
        """The deployments the ``config`` file names, read from it on each call."""
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


def export_for_workers(settings: Settings, *, metrics_dir: Path) -> None:
    """Put what worker processes need into the environment they inherit.

    Each worker of ``kvgate serve --workers N`` is a fresh process that builds its own
    ``Settings`` from the environment, so the CLI's choices go there first.
    """
    os.environ["KVGATE_WORKERS"] = str(settings.workers)
    if settings.config is not None:
        os.environ["KVGATE_CONFIG"] = str(settings.config.resolve())
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)


def child_environment(*, without: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a child process, less ``without``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in without}
    env.update(extra)
    return env


# Read by litellm at import time, so set before it: its bundled cost map and Anthropic
# beta-header list instead of fetching them, and no hub downloads for tokenizers.
LITELLM_ENVIRONMENT = {
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def prepare_litellm_environment() -> None:
    """Make litellm run offline and quiet: call before importing it."""
    os.environ.update(LITELLM_ENVIRONMENT)
