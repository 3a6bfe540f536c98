"""Settings, read from the environment with embedded defaults.

With nothing set, the portal runs embedded: SQLite under ./var, an in-memory Celery
broker and channel layer, local-memory cache, console email. Production sets
DATABASE_URL (PostgreSQL), REDIS_URL (broker, channel layer, cache), SECRET_KEY,
ALLOWED_HOSTS and EMAIL_URL. Every value is parsed by django-environ and a malformed
one stops start-up with the variable's name.
"""
from __future__ import annotations

import re
import secrets
from datetime import timedelta
from pathlib import Path

import environ
import redis.connection
from whitenoise.compress import Compressor

from common.private_files import private_dir, private_file, write_private

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("PORTAL_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()


def _secret_key() -> str:
    """SECRET_KEY from the environment (or SECRET_KEY_FILE); embedded mode keeps a generated one in ./var."""
    key = env.str("SECRET_KEY", default="")
    key_file = env.str("SECRET_KEY_FILE", default="")
    if key_file:
        key = Path(key_file).read_text().strip()
    if key:
        return key
    if not EMBEDDED:
        raise environ.ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set when REDIS_URL is set")
    path = private_dir(VAR_DIR) / "secret_key"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(50))
    return private_file(path).read_text().strip()


REDIS_URL = env.str("REDIS_URL", default="")
# Embedded = no Redis: broker, channel layer and cache stay inside the one process.
EMBEDDED = not REDIS_URL

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    # Swagger UI and ReDoc shipped as our own static files, pinned: /api/v1/docs/ works without internet.
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "mozilla_django_oidc",
    # django-auditlog's registry and diffs; "audit" holds our entry model, API and admin (audit/__init__.py).
    "auditlog",
    "audit",
    "teams",
    "inventory",
    "allocations",
    "monitoring",
    # The usage ledger and its API (reads grants, teams, pools and telemetry; the pages and wiring read it).
    "accounting",
    # The pages, then the wiring (for its runembedded command and deploy checks).
    "portal",
    "config",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The language: the language cookie (the switcher's), else the browser's Accept-Language.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Audit entries written during a request name its user and its source (API, admin or page).
    "audit.middleware.AuditSourceMiddleware",
    # A signed-in person's saved language and time zone beat the browser's (portal/preferences.py).
    "portal.preferences.PreferenceMiddleware",
    # The viewer's time zone for the pages and their forms (portal/timezones.py).
    "portal.timezones.TimezoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Redis or PostgreSQL unreachable in a view outside DRF: 503 JSON or the "temporarily unavailable" page.
    "config.outages.OutageMiddleware",
    # Last, as django-axes asks: it turns a lockout into a 429 page.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Passwords: every local account, or with LOCAL_LOGIN=staff only staff (the break-glass accounts).
    "teams.backends.LocalAccountsBackend",
    # Single sign-on (teams/oidc.py): inert until OIDC_ISSUER and OIDC_RP_CLIENT_ID are set.
    "teams.oidc.PortalOIDCBackend",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
                "teams.backends.sign_in_options",
                "portal.context_processors.navigation",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'portal.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    private_dir(VAR_DIR)
    # The database holds password hashes and host credentials: this account's alone.
    if DATABASES["default"]["NAME"] != ":memory:":
        Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
        private_file(Path(DATABASES["default"]["NAME"]))
    # IMMEDIATE takes the write lock when a transaction starts, so two reservations can
    # never both read "free" and then both write: SQLite serializes them.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"transaction_mode": "IMMEDIATE", "timeout": 30})
else:
    # A connection pool per process (Django's psycopg_pool support), not persistent connections.
    # Celery's Django fixup closes the database connections around every task: with persistent
    # connections that was a new PostgreSQL backend per task (a fork, authentication, cold catalog
    # caches), while closing a pooled connection hands it back. The threads of a web worker share
    # its pool, and so do the ASGI server's sync_to_async threads.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Django's PostgreSQL backend, whose pooled connections are checked before use only after
    # sitting idle (common/postgresql/base.py), not on every request as CONN_HEALTH_CHECKS does.
    DATABASES["default"]["ENGINE"] = "common.postgresql"
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DB_POOL_CHECK_AFTER_IDLE_SECONDS = env.float("DB_POOL_CHECK_AFTER_IDLE_SECONDS", default=1.0)
    _db_options = DATABASES["default"].setdefault("OPTIONS", {})
    _db_options["pool"] = {
        "min_size": env.int("DB_POOL_MIN_SIZE", default=1),
        "max_size": env.int("DB_POOL_MAX_SIZE", default=16),
        "timeout": env.float("DB_POOL_TIMEOUT_SECONDS", default=10.0),
    }
    # Parameters bound by the server and statements prepared on their fifth run in a connection:
    # PostgreSQL then plans a query once per connection, not on every call (measured: release
    # 3.3 -> 1.7 ms of PostgreSQL CPU, list 3.9 -> 1.8 ms). Turn off behind a pooler that cannot
    # keep prepared statements (PgBouncer in transaction mode before 1.21).
    if env.bool("DB_PREPARED_STATEMENTS", default=True):
        _db_options.update(server_side_binding=True, prepare_threshold=5)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- cache, broker, channel layer -------------------------------------------------------
def channel_layer_prefix(redis_url: str) -> str:
    """The start of every pub/sub channel name of this installation: CHANNEL_LAYER_PREFIX and the
    database number of REDIS_URL. Redis pub/sub ignores database numbers, so two portals sharing one
    Redis on two databases would otherwise receive each other's live messages."""
    name = env.str("CHANNEL_LAYER_PREFIX", default="gpupool")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", name):
        raise environ.ImproperlyConfigured("CHANNEL_LAYER_PREFIX must be 1 to 40 letters, digits, '-' or '_'")
    return f"{name}.{redis.connection.parse_url(redis_url).get('db', 0)}."


if EMBEDDED:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
else:
    CACHES = {"default": {"BACKEND": "common.redis_cache.SharedClientRedisCache", "LOCATION": REDIS_URL}}
    # Redis pub/sub layer: a group message is one PUBLISH, and each ASGI process receives it
    # once per group and hands it to its own sockets (local fan-out). The list-based
    # RedisChannelLayer copies every message into one Redis list per socket and pops each
    # copy back, which made delivery cost about 1 ms per socket. What we send (live charts,
    # "your leases changed" nudges) is worth nothing late and is re-read on reconnect, so the
    # pub/sub layer's at-most-once delivery is the right trade.
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "common.channel_layer.PubSubChannelLayer",
                    "CONFIG": {"hosts": [{"address": REDIS_URL}], "prefix": channel_layer_prefix(REDIS_URL)}}
    }
    CELERY_BROKER_URL = REDIS_URL
    # Beat, one active at a time however many run (RedBeat): the schedule lives in Redis and the
    # running beat holds a lock it renews every tick (at most BEAT_TICK_SECONDS apart); the others
    # wait on the lock and one takes over within BEAT_LOCK_SECONDS + a tick of the holder's death.
    # So a sweep or an alert evaluation is neither doubled nor skipped for longer than that.
    CELERY_BEAT_SCHEDULER = "config.beat.ResilientRedBeatScheduler"
    CELERY_REDBEAT_REDIS_URL = REDIS_URL
    CELERY_REDBEAT_KEY_PREFIX = channel_layer_prefix(REDIS_URL) + "redbeat"
    CELERY_REDBEAT_LOCK_TIMEOUT = env.int("BEAT_LOCK_SECONDS", default=5)
    CELERY_BEAT_MAX_LOOP_INTERVAL = env.float("BEAT_TICK_SECONDS", default=1.0)

# --- outages (common/outages.py) -------------------------------------------------------------
# Redis or PostgreSQL not answering costs a request a second or two, never the operating system's
# minutes of TCP retries; what a request then answers is in config/outages.py.
if not EMBEDDED:
    CACHES["default"]["OPTIONS"] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
if DATABASES["default"]["ENGINE"] == "common.postgresql":
    DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 3)

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Through a broker outage the worker reconnects for as long as it takes (config/broker.py).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# How often beat sweeps reservations (activate due ones, expire ended ones). The
# database is the truth; this sweep is what moves time-driven states.
RESERVATION_SWEEP_SECONDS = env.float("RESERVATION_SWEEP_SECONDS", default=5.0)

# --- audit log (audit/) ----------------------------------------------------------------------
# Every change of the models below is recorded (who, when, from where, the fields before and after).
# Fields left out: secrets and token digests (never in the log), and what changes on every heartbeat
# or use (a row per heartbeat would bury the changes people make).
AUDITLOG_LOGENTRY_MODEL = "audit.AuditEntry"
# django-auditlog's migrations create its own entry table even when another model replaces it (they
# predate the swap); unused, it held a foreign key to the users that stopped the test runner's TRUNCATE.
MIGRATION_MODULES = {"auditlog": None}
AUDITLOG_STORE_JSON_CHANGES = True  # before/after as JSON values, not their str()
# The models whose every change is recorded, each with the fields never recorded beside the ones every
# model leaves out (audit.apps.ALWAYS_UNTRACKED: timestamps of each heartbeat, use or save; reverse relations).
AUDIT_TRACKED_MODELS = {
    "auth.user": ["password", "date_joined"],
    "teams.team": [],
    "teams.membership": [],
    "teams.apitoken": ["digest"],
    "inventory.cluster": ["kubeconfig_encrypted", "prometheus_auth_encrypted", "last_discovered_at", "discovery_error"],
    "inventory.node": [],
    "inventory.gpupool": [],
    "inventory.gpu": [],
    "inventory.gpumodel": [],
    "inventory.hosttoken": ["key_hash"],
    "allocations.priorityclass": [],
    "allocations.quota": [],
    "accounting.price": [],
    # Its state changes are written by hand with their events (allocations.transitions.record); this
    # catches what changes through a save (an extension's new end, a field edited in the admin).
    "allocations.reservation": ["expiry_warned_at"],
    "monitoring.alertrule": [],
    "monitoring.silence": [],
    "teams.groupmapping": [],
    "teams.notificationchannel": ["url_encrypted", "secret_encrypted", "last_attempt_at", "last_error",
                                  "failing_since"],
}
# Entries older than this are deleted by a periodic task (the one path the append-only trigger allows).
AUDIT_RETENTION_DAYS = env.int("AUDIT_RETENTION_DAYS", default=400)
if AUDIT_RETENTION_DAYS < 1:
    raise environ.ImproperlyConfigured("AUDIT_RETENTION_DAYS must be at least 1")
AUDIT_RETENTION_CHECK_SECONDS = env.float("AUDIT_RETENTION_CHECK_SECONDS", default=3600.0)

# --- applying reservations (Kubernetes and host agents) -------------------------------------
# A reservation not applied (or undone) within this long fails with the reason, never hangs.
APPLY_DEADLINE = timedelta(seconds=env.float("APPLY_DEADLINE_SECONDS", default=600.0))
# Retries of a remote error wait base * 2^(attempt-1) seconds, capped.
APPLY_RETRY_BASE_SECONDS = env.float("APPLY_RETRY_BASE_SECONDS", default=2.0)
APPLY_RETRY_CAP_SECONDS = env.float("APPLY_RETRY_CAP_SECONDS", default=60.0)
# A running job's claim is a lease the worker renews every third of this; when its worker dies the
# sweep takes the job back once the lease lapses (so within this plus one sweep period).
APPLY_JOB_LEASE_SECONDS = env.float("APPLY_JOB_LEASE_SECONDS", default=15.0)
# A queued job whose Celery message has not started it after this long is started by the sweep
# (the message was lost, e.g. with a broker that went away without saving).
APPLY_LOST_MESSAGE_SECONDS = env.float("APPLY_LOST_MESSAGE_SECONDS", default=30.0)
# How often beat compares each cluster with the database and repairs drift.
RECONCILE_SECONDS = env.float("RECONCILE_SECONDS", default=30.0)
# /metrics names teams, hosts and GPU UUIDs. With METRICS_TOKEN set it answers only `Authorization:
# Bearer <METRICS_TOKEN>`; without one it is open in the embedded demo and refused (403) elsewhere,
# unless METRICS_PUBLIC=true says the ingress protects it.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_PUBLIC = env.bool("METRICS_PUBLIC", default=EMBEDDED)

# --- host agents ------------------------------------------------------------------------
AGENT_HEARTBEAT_SECONDS = env.float("AGENT_HEARTBEAT_SECONDS", default=10.0)
# A bare-metal host whose agent is silent this long is marked unhealthy (no new placements).
HOST_SILENCE_TIMEOUT = timedelta(seconds=env.float("HOST_SILENCE_TIMEOUT_SECONDS", default=60.0))
HOST_SILENCE_CHECK_SECONDS = env.float("HOST_SILENCE_CHECK_SECONDS", default=15.0)

# --- Kubernetes clusters ------------------------------------------------------------------
# Fernet key(s) that encrypt stored kubeconfigs (comma-separated: the first encrypts, all
# decrypt, so keys can be rotated). Unset: a key derived from SECRET_KEY — fine for the
# embedded demo and tests, but then rotating SECRET_KEY makes stored kubeconfigs unreadable;
# set FIELD_ENCRYPTION_KEY in production (`python -c "from cryptography.fernet import
# Fernet; print(Fernet.generate_key().decode())"`).
FIELD_ENCRYPTION_KEYS = env.list("FIELD_ENCRYPTION_KEY", default=[])
CLUSTER_DISCOVERY_SECONDS = env.float("CLUSTER_DISCOVERY_SECONDS", default=60.0)
KUBE_REQUEST_TIMEOUT_SECONDS = env.float("KUBE_REQUEST_TIMEOUT_SECONDS", default=10.0)
# Shared secret the admission webhooks require (Authorization: Bearer, or the last path
# segment of the webhook URL); empty = no token (protect the route at the ingress instead).
KUBE_WEBHOOK_TOKEN = env.str("KUBE_WEBHOOK_TOKEN", default="")
# Where the portal writes the device-plugin and mig-parted ConfigMaps on every Kubernetes cluster:
# the namespace NVIDIA's device plugin and MIG manager read theirs from (with the GPU Operator,
# its own namespace, e.g. gpu-operator).
KUBE_SYSTEM_NAMESPACE = env.str("KUBE_SYSTEM_NAMESPACE", default="gpupool-system")

# --- telemetry and alerts (monitoring) ------------------------------------------------------
# History: raw 1 Hz samples, then 1-minute and 1-hour aggregates, each kept this long.
TELEMETRY_RAW_RETENTION = timedelta(minutes=env.int("TELEMETRY_RAW_RETENTION_MINUTES", default=60))
TELEMETRY_MINUTE_RETENTION = timedelta(days=env.int("TELEMETRY_MINUTE_RETENTION_DAYS", default=7))
TELEMETRY_HOUR_RETENTION = timedelta(days=env.int("TELEMETRY_HOUR_RETENTION_DAYS", default=400))
TELEMETRY_ROLLUP_SECONDS = env.float("TELEMETRY_ROLLUP_SECONDS", default=60.0)
# Ingest limits: a bigger request is refused (413), a faster agent throttled (429).
TELEMETRY_MAX_SAMPLES_PER_REQUEST = env.int("TELEMETRY_MAX_SAMPLES_PER_REQUEST", default=20000)
TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE = env.int("TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE", default=60000)
# The ingest's body limit (its own, not DATA_UPLOAD_MAX_MEMORY_SIZE's 2.5 MB, which a request of 20,000
# samples passes at ~250-450 bytes of JSON each): 1 KiB per sample allowed, so the 413 for too many
# samples is what a realistic request meets first.
TELEMETRY_MAX_BODY_BYTES = env.int("TELEMETRY_MAX_BODY_BYTES", default=TELEMETRY_MAX_SAMPLES_PER_REQUEST * 1024)
TELEMETRY_MAX_FUTURE_SECONDS = env.float("TELEMETRY_MAX_FUTURE_SECONDS", default=30.0)
# A GPU at or below this utilization counts as idle ("allocated but idle").
TELEMETRY_IDLE_UTIL_PCT = env.float("TELEMETRY_IDLE_UTIL_PCT", default=1.0)
# Kubernetes GPUs' telemetry (monitoring.kubernetes): beat checks this often which clusters are due a
# read (each cluster has its own period, Cluster.telemetry_period_seconds); one read waits this long for
# the cluster's Prometheus or an exporter pod; a cluster whose reads failed this long (or 3 of its
# periods, if longer) is silent.
TELEMETRY_K8S_TICK_SECONDS = env.float("TELEMETRY_K8S_TICK_SECONDS", default=1.0)
TELEMETRY_K8S_TIMEOUT_SECONDS = env.float("TELEMETRY_K8S_TIMEOUT_SECONDS", default=4.0)
TELEMETRY_K8S_SILENT_SECONDS = env.float("TELEMETRY_K8S_SILENT_SECONDS", default=30.0)
# The usage ledger (accounting/ledger.py): beat closes finished hours this often; an hour is closed this
# long after it ends (its last minute rollups are in), and closed again, for good, once late telemetry
# had this long to arrive. A minute whose average memory in use reaches USAGE_BUSY_MEMORY_MIB counts as
# used even at 0 % utilization (a process holds the card; an idle card shows a few MiB).
USAGE_CLOSE_SECONDS = env.float("USAGE_CLOSE_SECONDS", default=300.0)
USAGE_CLOSE_DELAY_SECONDS = env.int("USAGE_CLOSE_DELAY_SECONDS", default=180)
USAGE_LATE_TELEMETRY_SECONDS = env.int("USAGE_LATE_TELEMETRY_SECONDS", default=2 * 3600)
USAGE_BUSY_MEMORY_MIB = env.float("USAGE_BUSY_MEMORY_MIB", default=64.0)
ALERT_EVALUATE_SECONDS = env.float("ALERT_EVALUATE_SECONDS", default=15.0)
# Idle reclaim (monitoring.idle; each pool opts in and sets its minutes): how often beat sweeps.
IDLE_RECLAIM_SWEEP_SECONDS = env.float("IDLE_RECLAIM_SWEEP_SECONDS", default=60.0)
# Right-sizing advice (accounting.advice): how many of a team's or user's last ended reservations it reads.
ADVICE_RESERVATIONS = env.int("ADVICE_RESERVATIONS", default=20)
# Links in mails (alerts, failovers) point here. Unset: this machine on the port the portal serves on
# (PORT, which `make run` and the web server read), not a fixed 8000 that may be another program's.
PORTAL_BASE_URL = (env.str("PORTAL_BASE_URL", default="").rstrip("/")
                   or f"http://127.0.0.1:{env.int('PORT', default=8000)}")

# --- reservations ---------------------------------------------------------------------
# A starts_at up to this far in the past is taken as "now" (clock skew, slow forms).
RESERVATION_START_GRACE = timedelta(seconds=env.int("RESERVATION_START_GRACE_SECONDS", default=300))
RESERVATION_MAX_DURATION = timedelta(days=env.int("RESERVATION_MAX_DAYS", default=90))
RESERVATION_MAX_LEAD = timedelta(days=env.int("RESERVATION_MAX_LEAD_DAYS", default=365))

# Holders of a running reservation are mailed this long before its window ends, with a link to extend it.
EXPIRY_WARNING = timedelta(seconds=env.int("EXPIRY_WARNING_SECONDS", default=1800))

# Reclaiming borrowed GPUs: the notice a borrower gets before they are taken back, and the least a
# booking runs before it may be reclaimed.
PREEMPTION_NOTICE = timedelta(seconds=env.int("PREEMPTION_NOTICE_SECONDS", default=600))
PREEMPTION_MIN_RUNTIME = timedelta(seconds=env.int("PREEMPTION_MIN_RUNTIME_SECONDS", default=600))

# --- the queue (allocations.queue) ---------------------------------------------------------------
# The longest a request may ask to run when it waits for room (`duration`).
QUEUE_MAX_DURATION = timedelta(days=env.int("QUEUE_MAX_DURATION_DAYS", default=30))
# How many of a pool's ended bookings the estimate (likely_start) learns early releases from.
QUEUE_HISTORY = env.int("QUEUE_HISTORY", default=500)
# How many of a pool's waiting requests, from the head of its queue, each pass plans in full (a start_by,
# a likely start, room held for them); the rest wait with a position, "not planned yet" (Slurm's bf_max_job_test).
QUEUE_PLAN_DEPTH = env.int("QUEUE_PLAN_DEPTH", default=100)
# Fair-share ordering: how fast a team's past use fades (Slurm's PriorityDecayHalfLife is 7 days).
QUEUE_FAIRSHARE_HALF_LIFE = timedelta(hours=env.float("QUEUE_FAIRSHARE_HALF_LIFE_HOURS", default=24.0))
# Kicks of one pool's pass within this many seconds share one pass (its start clears the mark).
QUEUE_PASS_COALESCE_SECONDS = env.int("QUEUE_PASS_COALESCE_SECONDS", default=30)
# The backstop: every pool with waiting requests gets a pass this often, whatever happened.
QUEUE_PASS_SECONDS = env.float("QUEUE_PASS_SECONDS", default=30.0)

# --- auth -----------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# API tokens a user keeps; making one more deletes the oldest.
API_TOKENS_PER_USER = env.int("API_TOKENS_PER_USER", default=25)
# Every API token stops working this many days after it was made, whatever expiry it was given
# (tokens made before expiries existed included); a new token's default life is the second.
API_TOKEN_MAX_AGE_DAYS = env.int("API_TOKEN_MAX_AGE_DAYS", default=365)
API_TOKEN_DEFAULT_DAYS = env.int("API_TOKEN_DEFAULT_DAYS", default=90)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
# "all": every local account signs in with its password; "staff": only staff do (break-glass accounts,
# when everyone else signs in through the identity provider).
LOCAL_LOGIN = env.str("LOCAL_LOGIN", default="all")
if LOCAL_LOGIN not in ("all", "staff"):
    raise environ.ImproperlyConfigured("LOCAL_LOGIN must be all or staff")

# --- notification channels (teams/notify.py) ------------------------------------------------------
NOTIFY_ATTEMPTS = env.int("NOTIFY_ATTEMPTS", default=6)  # then a delivery is given up
NOTIFY_RETRY_SECONDS = env.float("NOTIFY_RETRY_SECONDS", default=30.0)  # doubled after each failure
NOTIFY_TIMEOUT_SECONDS = env.float("NOTIFY_TIMEOUT_SECONDS", default=10.0)
NOTIFY_SWEEP_SECONDS = env.float("NOTIFY_SWEEP_SECONDS", default=15.0)  # how often beat sends what is due
# Webhook URLs leading to loopback or private addresses are refused unless this is set (a site whose
# chat server is on its own network sets it).
NOTIFY_ALLOW_PRIVATE_URLS = env.bool("NOTIFY_ALLOW_PRIVATE_URLS", default=False)

# --- single sign-on (OpenID Connect, teams/oidc.py) ----------------------------------------------
# Set OIDC_ISSUER and OIDC_RP_CLIENT_ID to turn it on; the endpoints come from the issuer's discovery
# document unless OIDC_OP_AUTHORIZATION_ENDPOINT, _TOKEN_, _USER_ or _JWKS_ENDPOINT say otherwise.
OIDC_ISSUER = env.str("OIDC_ISSUER", default="")
OIDC_PROVIDER_NAME = env.str("OIDC_PROVIDER_NAME", default="single sign-on")
OIDC_RP_CLIENT_ID = env.str("OIDC_RP_CLIENT_ID", default="")
_oidc_secret_file = env.str("OIDC_RP_CLIENT_SECRET_FILE", default="")
OIDC_RP_CLIENT_SECRET = (Path(_oidc_secret_file).read_text().strip() if _oidc_secret_file
                         else env.str("OIDC_RP_CLIENT_SECRET", default=""))
OIDC_RP_SCOPES = env.str("OIDC_RP_SCOPES", default="openid email profile")
OIDC_RP_SIGN_ALGO = env.str("OIDC_RP_SIGN_ALGO", default="RS256")
OIDC_OP_AUTHORIZATION_ENDPOINT = env.str("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env.str("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env.str("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env.str("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_USE_PKCE = True
OIDC_USERNAME_CLAIM = env.str("OIDC_USERNAME_CLAIM", default="preferred_username")
OIDC_GROUPS_CLAIM = env.str("OIDC_GROUPS_CLAIM", default="groups")
OIDC_TIMEOUT = env.int("OIDC_TIMEOUT_SECONDS", default=10)
# --- LDAP / Active Directory (teams/ldap.py; needs requirements-ldap.txt) ----------------------------
# On when LDAP_SERVER_URI is set. Users are found under LDAP_USER_SEARCH_BASE with LDAP_USER_FILTER
# (%(user)s is the username typed), groups under LDAP_GROUP_SEARCH_BASE; LDAP_GROUP_TYPE is
# group_of_names (member: DN), posix (memberUid) or active_directory (nested groups).
LDAP_SERVER_URI = env.str("LDAP_SERVER_URI", default="")
if LDAP_SERVER_URI:
    import ldap as _ldap
    from django_auth_ldap.config import (GroupOfNamesType, LDAPSearch, NestedActiveDirectoryGroupType,
                                         PosixGroupType)

    _ldap_password_file = env.str("LDAP_BIND_PASSWORD_FILE", default="")
    AUTH_LDAP_SERVER_URI = LDAP_SERVER_URI
    AUTH_LDAP_BIND_DN = env.str("LDAP_BIND_DN", default="")
    AUTH_LDAP_BIND_PASSWORD = (Path(_ldap_password_file).read_text().strip() if _ldap_password_file
                               else env.str("LDAP_BIND_PASSWORD", default=""))
    AUTH_LDAP_START_TLS = env.bool("LDAP_START_TLS", default=False)
    AUTH_LDAP_USER_SEARCH = LDAPSearch(env.str("LDAP_USER_SEARCH_BASE"), _ldap.SCOPE_SUBTREE,
                                       env.str("LDAP_USER_FILTER", default="(uid=%(user)s)"))
    AUTH_LDAP_USER_ATTR_MAP = {"first_name": "givenName", "last_name": "sn", "email": "mail"}
    _group_types = {"group_of_names": (GroupOfNamesType, "(objectClass=groupOfNames)"),
                    "posix": (PosixGroupType, "(objectClass=posixGroup)"),
                    "active_directory": (NestedActiveDirectoryGroupType, "(objectClass=group)")}
    _group_type, _group_filter = _group_types[env.str("LDAP_GROUP_TYPE", default="group_of_names")]
    AUTH_LDAP_GROUP_SEARCH = LDAPSearch(env.str("LDAP_GROUP_SEARCH_BASE"), _ldap.SCOPE_SUBTREE, _group_filter)
    AUTH_LDAP_GROUP_TYPE = _group_type()
    AUTH_LDAP_CONNECTION_OPTIONS = {_ldap.OPT_NETWORK_TIMEOUT: env.int("LDAP_TIMEOUT_SECONDS", default=10)}
    AUTHENTICATION_BACKENDS.insert(2, "teams.ldap.PortalLDAPBackend")

OIDC_AUTHENTICATE_CLASS = "teams.oidc.PortalOIDCRequestView"
OIDC_CALLBACK_CLASS = "teams.oidc.PortalOIDCCallbackView"
LOGIN_REDIRECT_URL_FAILURE = "login"

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failures for one username
# from one address, that pair is locked out for AXES_COOLOFF_TIME (answered with 429).
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("AXES_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_CALLABLE = "config.lockout.lockout_response"
AXES_VERBOSE = False

# --- i18n, static -----------------------------------------------------------------------
# English and Simplified Chinese. Catalogues: locale/ (templates, config, portal) and each app's locale/;
# `python manage.py translations` rebuilds them, `--check` (run by the tests) fails on a string that is
# not marked or not translated.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True
# 24-hour date and time formats wherever Django formats a time (config/formats/en/formats.py).
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
# Compressed and fingerprinted by collectstatic, so browsers keep them a year (config/static.py).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.static.PortalStaticStorage"},
}
# Serve straight from the source folders too, so a fresh checkout needs no collectstatic.
WHITENOISE_USE_FINDERS = True
# collectstatic compresses each file it keeps at Brotli's and gzip's top levels, its slowest part (65 s of CPU
# here with both names of every file and the source maps, 18 s without). Pages name files by their
# fingerprinted names, so only those are kept; a plain name is still served, from the source folders (above).
# Source maps are fetched only by a developer's browser tools: not worth compressing ahead.
WHITENOISE_KEEP_ONLY_HASHED_FILES = True
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = (*Compressor.SKIP_COMPRESS_EXTENSIONS, "map")

# --- email ----------------------------------------------------------------------------
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="GPU Pool Portal <gpupool@localhost>")

# --- REST API ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "teams.tokens.CachedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's three, with the JSON one refusing over-deep nesting as a 400 (common.api.JSONParser).
    "DEFAULT_PARSER_CLASSES": ["common.api.JSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "common.api.Pagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.exception_handler.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"login": env.str("LOGIN_THROTTLE_RATE", default="20/min")},
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Pool Portal API",
    "DESCRIPTION": "Reserve whole GPUs from shared pools; manage teams, pools and quotas.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page loads Swagger UI from our static files (drf-spectacular-sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "config.api_schema.declare_error_responses"],
    # Reservations and alerts both have a "state" with different choices: name the two enums.
    "ENUM_NAME_OVERRIDES": {
        "ReservationStateEnum": "allocations.models.Reservation.State",
        "AlertStateEnum": "monitoring.models.Alert.State",
        # Two models have a `kind` and two a `scope`: each choice set named after its model.
        "ClusterKindEnum": "inventory.models.Cluster.Kind",
        "ChannelKindEnum": "teams.models.NotificationChannel.Kind",
        "TokenScopeEnum": "teams.models.ApiToken.Scope",
        "AlertRuleScopeEnum": "monitoring.models.Scope",
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# HTTPS=true: the portal is served over TLS (by a proxy that sets X-Forwarded-Proto, or by
# WEB_TLS_CERT), and gets the secure defaults `manage.py check --deploy` asks for.
HTTPS = env.bool("HTTPS", default=False)
SILENCED_SYSTEM_CHECKS: list[str] = []
if HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    LANGUAGE_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # HSTS: a browser that saw the header over HTTPS refuses plain HTTP to this host (and, with
    # include-subdomains, to the hosts under it) for that long. Set include-subdomains false when the
    # portal is served at a domain's apex and some host under it still speaks plain HTTP.
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading asks browser vendors to hard-code the domain, which takes months to undo:
        # the domain's owner decides that, not a default.
        SILENCED_SYSTEM_CHECKS.append("security.W021")
    # Plain HTTP is redirected to HTTPS, except what kubelet probes and in-cluster scrapers ask the
    # pod directly over HTTP (no X-Forwarded-Proto). SECURE_SSL_REDIRECT=false leaves the redirect to
    # the ingress (needed when other in-cluster clients call the API over plain HTTP).
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SECURE_REDIRECT_EXEMPT = [r"^(healthz|readyz|metrics)$"]
    if not SECURE_SSL_REDIRECT:
        SILENCED_SYSTEM_CHECKS.append("security.W008")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
