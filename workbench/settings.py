"""Settings, all from the environment (one place), with defaults that run on one machine."""

from datetime import timedelta
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
# Signs logins, CSRF tokens and the API's page cursors: one long random value for web, workers and beat alike.
# The public default (and compose's old placeholder) is for development only: the web server, workers and beat
# refuse to start with one unless DEBUG is on, the test suite runs them (pytest sets PYTEST_VERSION), or
# ALLOW_INSECURE_SECRET_KEY=true (workbench/secret_key.py). `make run` makes a key once, in .cache/secret-key.
INSECURE_SECRET_KEYS = ("workbench-insecure-dev-key-set-SECRET_KEY-in-production", "change-me")
SECRET_KEY = env("SECRET_KEY", default="") or INSECURE_SECRET_KEYS[0]  # an empty one is none
ALLOW_INSECURE_SECRET_KEY = env.bool("ALLOW_INSECURE_SECRET_KEY", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
PORT = env.int("PORT", default=8000)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "kernel.apps.KernelConfig",
    "sessions.apps.SessionsConfig",
    "harness.apps.HarnessConfig",
    "sandboxes.apps.SandboxesConfig",
    "vault.apps.VaultConfig",
]

MIDDLEWARE = [
    "workbench.middleware.RefuseNonText",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: it turns a refused login into the lockout page
]

ROOT_URLCONF = "workbench.urls"
ASGI_APPLICATION = "workbench.asgi.application"

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
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'workbench.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Many processes (web, workers, beat) write one file: take the write lock up front and wait for it
    # rather than failing, and let readers run beside the writer.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A file, not memory, so that the worker and server processes tests start can share it.
    _name = str(DATABASES["default"]["NAME"])
    DATABASES["default"].setdefault("TEST", {"NAME": _name.removesuffix(".sqlite3") + "-test.sqlite3"})
else:
    # Appends run their statements on server-binding cursors (sessions/services/log.py); let psycopg keep
    # them prepared. Behind a transaction-pooling PgBouncer, set DATABASE_PREPARE_THRESHOLD to "".
    _threshold = env("DATABASE_PREPARE_THRESHOLD", default="5")
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
        int(_threshold) if _threshold else None
    )
    # Under ASGI every request runs on a thread of its own, so Django's persistent connections cannot be
    # reused and each request would open one: a psycopg pool per process keeps them instead. Size it
    # above a Celery worker's concurrency; DATABASE_POOL=false falls back to CONN_MAX_AGE.
    if env.bool("DATABASE_POOL", default=True):
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": env.int("DATABASE_POOL_MIN", default=2),
            "max_size": env.int("DATABASE_POOL_MAX", default=40),
            "timeout": env.float("DATABASE_POOL_TIMEOUT", default=30.0),
        }
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        # The pool checks a connection as it hands it out (one empty round trip): after the server restarts
        # (`make run` restarts a killed one), the connections the pool kept are dead, and would each fail a
        # request or a wake instead.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("DATABASE_POOL_CHECK", default=True)
    else:
        DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
        DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")

# Pub/sub: a broadcast is one PUBLISH. Delivery is at most once, which is all a hint needs: readers fill
# any gap from the log.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
# One (disabled) result backend per process, not one per thread: Celery makes it on a thread's first
# `apply_async`, and under ASGI each request has a thread of its own, so every request that queued a wake made
# one (0.5 ms of the request's CPU on the way to its brain).
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# No worker-wide time limit (CELERY_TASK_TIME_LIMIT): every task but the wake sets its own, and the wake has
# none on purpose, its lease being its heartbeat (harness/tasks.py).
# The sweeper, not the broker's redelivery, brings back the work of a dead worker; a long visibility
# timeout keeps Redis from handing the same wake to a second worker while the first still runs.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# A request that queued a wake answers once its events are committed: it waits on the broker at most this
# long (a hung or refusing Redis), and the sweeper wakes the session if the message did not go out.
WAKE_PUBLISH_TIMEOUT_SECONDS = env.float("WAKE_PUBLISH_TIMEOUT_SECONDS", default=1.0)
# Broker connections a process keeps for publishing wakes (more requests at once wait for one).
WAKE_PUBLISH_CONNECTIONS = env.int("WAKE_PUBLISH_CONNECTIONS", default=16)
# The sweeper queues at most one wake per session: it queues another only once a brain took the lease
# since, or after this long (a wake lost with the broker).
WAKE_REQUEUE_SECONDS = env.float("WAKE_REQUEUE_SECONDS", default=60.0)
# A wake whose database connection breaks (PostgreSQL restarting) waits for it this long, trying again every
# second, then goes on with the session: a lease its brain could not release is released then.
WAKE_DATABASE_WAIT_SECONDS = env.float("WAKE_DATABASE_WAIT_SECONDS", default=60.0)
# A POST's Idempotency-Key is remembered this long (a retry with it returns the first answer).
IDEMPOTENCY_KEY_HOURS = env.float("IDEMPOTENCY_KEY_HOURS", default=24.0)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/admin/login/"

# Login throttling (django-axes), on every form login (the UI's /login/ and the admin's): after
# LOGIN_FAILURE_LIMIT wrong passwords for one username from one address, that pair is refused (429, the lockout
# page) until LOGIN_COOLOFF_MINUTES pass after its last try; failures older than that are forgotten, and a good
# login forgets them at once. Locking the pair, not the address or the name alone, keeps one attacker from
# locking an operator out from elsewhere. The address is REMOTE_ADDR: behind a proxy every login comes from
# the proxy, so the lock is then per username. `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("LOGIN_COOLOFF_MINUTES", default=15.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/lockout.html"
AXES_VERBOSE = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / ".staticfiles"

# The /v1 API refuses bodies over this size with 413.
API_MAX_BODY_BYTES = 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES + 1024
# Seconds between keep-alive pings on an idle SSE stream, and between the catch-up reads that make
# broadcasts mere hints for live streams.
STREAM_PING_SECONDS = env.float("STREAM_PING_SECONDS", default=15.0)
STREAM_CATCHUP_SECONDS = env.float("STREAM_CATCHUP_SECONDS", default=2.0)
# How often an SSE stream asks again whether its caller's credential still reaches it (revoked, work item stopped).
STREAM_RECHECK_SECONDS = env.float("STREAM_RECHECK_SECONDS", default=5.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# The model. Without ANTHROPIC_API_KEY the brains talk to the offline model (`make run` starts it).
ANTHROPIC_API_KEY = env("ANTHROPIC_API_KEY", default="")
OFFLINE_MODEL_URL = env("OFFLINE_MODEL_URL", default="http://127.0.0.1:8765")
ANTHROPIC_BASE_URL = env("ANTHROPIC_BASE_URL", default="" if ANTHROPIC_API_KEY else OFFLINE_MODEL_URL)
MODEL_MAX_TOKENS = env.int("MODEL_MAX_TOKENS", default=4096)
MODEL_TIMEOUT_SECONDS = env.float("MODEL_TIMEOUT_SECONDS", default=600.0)
# Overloaded and rate-limited model requests are retried this many times, backing off from the base.
MODEL_RETRIES = env.int("MODEL_RETRIES", default=4)
MODEL_RETRY_BASE_SECONDS = env.float("MODEL_RETRY_BASE_SECONDS", default=0.5)

# A brain's lease on a session lasts this long unless renewed (it renews a third of the way in); the
# sweeper runs every SWEEP_SECONDS and re-wakes sessions whose lease expired with work pending.
LEASE_SECONDS = env.float("LEASE_SECONDS", default=10.0)
SWEEP_SECONDS = env.float("SWEEP_SECONDS", default=2.0)
# A session whose wakes die this many times in a row on the same step (no progress written between the
# crashes) is parked with a session.error; crashes with progress between them start the count again.
WAKE_CRASH_LIMIT = env.int("WAKE_CRASH_LIMIT", default=3)
# Before the third and later attempts at a step that killed its brain: this, doubling (one crash is retried
# at once: it is most often bad luck, and the resume it would slow is what users wait for).
WAKE_CRASH_BACKOFF_SECONDS = env.float("WAKE_CRASH_BACKOFF_SECONDS", default=1.0)
# The name of this machine in the leases its brains hold (default: the hostname). A process frees the leases
# of processes of its own machine that are gone; processes that cannot see one another must not share it.
LEASE_HOST = env("LEASE_HOST", default="")
# How often a worker's main process looks whether one of its pool processes died (harness.pool), so the dead
# brain's session is resumed at once rather than at the pool's own look, every 5 s.
POOL_WATCH_SECONDS = env.float("POOL_WATCH_SECONDS", default=0.1)
# How often a working brain looks for a user.interrupt (seconds).
INTERRUPT_POLL_SECONDS = env.float("INTERRUPT_POLL_SECONDS", default=0.2)
TOOL_TIMEOUT_SECONDS = env.float("TOOL_TIMEOUT_SECONDS", default=120.0)

REAP_SECONDS = env.float("REAP_SECONDS", default=30.0)
CELERY_BEAT_SCHEDULE = {
    "sweep-sessions": {"task": "harness.tasks.sweep", "schedule": SWEEP_SECONDS},
    "reap-sandboxes": {"task": "sandboxes.tasks.reap", "schedule": REAP_SECONDS},
    "maintain-pools": {"task": "sandboxes.tasks.maintain_pools", "schedule": 60.0},
}

# Sandboxes: "docker" (hardened containers) or "local" (bubblewrap); see sandboxes/providers.
SANDBOX_PROVIDER = env("SANDBOX_PROVIDER", default="docker")
SANDBOX_IMAGE = env("SANDBOX_IMAGE", default="workbench-sandbox:latest")
# Labels this deployment's sandboxes, so the reaper only ever removes its own on a shared engine.
_database = DATABASES["default"]
WORKBENCH_DEPLOYMENT = env(
    "WORKBENCH_DEPLOYMENT",
    default=__import__("hashlib")
    .sha1(f"{_database.get('HOST')}:{_database.get('PORT')}/{_database.get('NAME')}".encode())
    .hexdigest()[:12],
)
# "lazy": a sandbox is provisioned by the first tool call that needs one. "eager" ("coupled"): the
# session's first turn provisions it before the first model call, for the latency comparison.
SANDBOX_PROVISIONING = env("SANDBOX_PROVISIONING", default="lazy")
# Lazy provisioning's head start (harness/speculation.py): when a turn begins and the session holds no
# sandbox, its sandbox is provisioned in the background while the model thinks, and the first tool call
# takes it (or waits only for the rest). "auto": if the agent has the toolset and the session has resources
# its sandbox is prepared with (repositories, files); "always": whenever the agent has the toolset; "never".
# An environment's config.sandbox.speculative overrides it.
SPECULATIVE_PROVISIONING = env("SPECULATIVE_PROVISIONING", default="auto")
# A sandbox provisioned ahead that no tool call has used yet is reaped once idle this long (or its
# environment's idle_ttl_seconds, if shorter); once used, it is any other sandbox.
SPECULATIVE_IDLE_SECONDS = env.int("SPECULATIVE_IDLE_SECONDS", default=300)
# A turn provisions ahead only while fewer sandboxes than this are being provisioned (for any session or
# pool): past the engine's capacity, the speculative ones are the work shed, and the first tool call
# provisions as it would with "never".
SPECULATIVE_MAX_IN_FLIGHT = env.int("SPECULATIVE_MAX_IN_FLIGHT", default=4)
# A sandbox provisioned ahead that no call used goes back to its environment when its session ends, for the
# next session that would start one (sandboxes/returns.py); at most this many wait per environment, each
# removed SPECULATIVE_IDLE_SECONDS after its return if none takes it. 0: each is removed at its session's end.
SPECULATIVE_RETURNED_MAX = env.int("SPECULATIVE_RETURNED_MAX", default=8)

# What one session's sandboxes may take, installation-wide. An environment asking for more than a maximum
# is refused with a 400 naming the field and the maximum; a stored value over a maximum lowered later is
# cut to it at provisioning. Defaults for one machine: the hosted service's 8 GB of memory and 10 GB of
# disk per sandbox, every core this process may run on, 4096 processes, 10 warm sandboxes per environment,
# and 8 live sandboxes per session (an environment's config.sandbox.max_sandboxes may lower that).
SANDBOX_MAX_MEMORY_MB = env.int("SANDBOX_MAX_MEMORY_MB", default=8192)
SANDBOX_MAX_CPUS = env.float("SANDBOX_MAX_CPUS", default=float(len(__import__("os").sched_getaffinity(0))))
SANDBOX_MAX_PIDS = env.int("SANDBOX_MAX_PIDS", default=4096)
SANDBOX_MAX_DISK_MB = env.int("SANDBOX_MAX_DISK_MB", default=10240)
SANDBOX_MAX_WARM_POOL = env.int("SANDBOX_MAX_WARM_POOL", default=10)
SANDBOX_MAX_PER_SESSION = env.int("SANDBOX_MAX_PER_SESSION", default=8)
# A sandbox's disk quota (what it may write: /workspace, /tmp, home) unless its environment sets
# config.sandbox.disk_mb. Docker enforces it only with overlay2 on XFS mounted with pquota, or with
# btrfs, which scripts/start-dockerd.sh sets up when it starts the engine; on another engine provisioning
# fails and says so. SANDBOX_DISK_QUOTA=off runs sandboxes without a disk quota instead (a sandbox can
# then fill the engine's disk).
SANDBOX_DISK_MB = env.int("SANDBOX_DISK_MB", default=4096)
SANDBOX_DISK_QUOTA = env.bool("SANDBOX_DISK_QUOTA", default=True)

# Hosts a session's github_repository may be cloned from over plain http:// or git:// (e.g. 127.0.0.1 for a
# git server on loopback in development, tests and benchmarks); every other repository URL must be https://.
REPOSITORY_PLAIN_HOSTS = env.list("REPOSITORY_PLAIN_HOSTS", default=[])
# The workers' repository cache (sandboxes/mirrors.py): a bare mirror per repository URL, brought up to date
# through the egress proxy as each session that clones (which must still prove its access), and the clone
# made from it. Default under the data folder (WORKBENCH_DATA_DIR, `make run`'s, default .cache); empty: no
# cache, every clone from the network. Past REPOSITORY_CACHE_MAX_MB, the least recently used mirrors go.
REPOSITORY_CACHE_DIR = env(
    "REPOSITORY_CACHE_DIR",
    default=str(BASE_DIR / env("WORKBENCH_DATA_DIR", default=".cache") / "repositories"),
)
REPOSITORY_CACHE_MAX_MB = env.int("REPOSITORY_CACHE_MAX_MB", default=10240)
# Checkout images (sandboxes/repositories.py): past the 4 newest of a repository, folder and checkout, at most
# this many of the deployment's are kept on the engine, the ones made last.
CHECKOUT_IMAGES_MAX = env.int("CHECKOUT_IMAGES_MAX", default=32)

# The vault (vault/crypto.py). Secrets are sealed to an X25519 key-encryption key: the web server and
# workers seal with its public half (VAULT_PUBLIC_KEYS, JSON, or VAULT_PUBLIC_KEY_FILE); only the egress
# proxy and `manage.py vault_key rotate` open them with the private half (VAULT_KEYS or VAULT_KEY_FILE, set
# for those processes alone). `manage.py vault_key init` makes both files.
VAULT_KEYS = env("VAULT_KEYS", default="")
VAULT_KEY_FILE = env("VAULT_KEY_FILE", default="")
VAULT_PUBLIC_KEYS = env("VAULT_PUBLIC_KEYS", default="")
VAULT_PUBLIC_KEY_FILE = env("VAULT_PUBLIC_KEY_FILE", default=str(BASE_DIR / ".vault" / "public.json"))
# Hosts an MCP server or OAuth token endpoint may be reached at over plain http:// (e.g. 127.0.0.1 in
# development and tests); every other such URL must be https://, since a credential travels with it.
EGRESS_PLAIN_HOSTS = env.list("EGRESS_PLAIN_HOSTS", default=[])
# The egress proxy's control endpoint (vault/egress): where the web server asks it to validate a credential
# (the proxy alone can open one), and the token it takes. Empty: no proxy runs, and validation says so.
EGRESS_CONTROL_URL = env("EGRESS_CONTROL_URL", default="")
EGRESS_CONTROL_TOKEN = env("EGRESS_CONTROL_TOKEN", default="")

# --- The egress proxy (vault/egress) and the sandboxes' network through it ---------------------------------
# SANDBOX_EGRESS on: a docker sandbox whose environment has networking is put on an internal Docker network
# (EGRESS_NETWORK, subnet EGRESS_SUBNET, no route out) whose only open port on the host is the egress proxy's
# (`python -m vault.egress`, at the subnet's first address, port EGRESS_PORT); the host's other services are
# closed to it by iptables INPUT rules on its bridge (EGRESS_FIREWALL). Off: sandboxes have no network.
SANDBOX_EGRESS = env.bool("SANDBOX_EGRESS", default=False)
EGRESS_NETWORK = env("EGRESS_NETWORK", default=f"workbench-egress-{WORKBENCH_DEPLOYMENT}")
EGRESS_BRIDGE = env("EGRESS_BRIDGE", default=f"wbe-{WORKBENCH_DEPLOYMENT[:11]}")
# Outside the Docker engine's default address pools (172.17-31.0.0/16, 192.168.0.0/16), so no other network takes it.
EGRESS_SUBNET = env("EGRESS_SUBNET", default="10.213.0.0/24")
EGRESS_PORT = env.int("EGRESS_PORT", default=3128)
EGRESS_FIREWALL = env.bool("EGRESS_FIREWALL", default=True)
# The proxy's data folder: its CA (mitmproxy's confdir) and the bundle sandboxes trust (the system's CAs and
# the proxy's), which the docker provider mounts read-only over the image's.
EGRESS_DATA_DIR = env.path("EGRESS_DATA_DIR", default=BASE_DIR / ".egress")
EGRESS_SYSTEM_CA_FILE = env("EGRESS_SYSTEM_CA_FILE", default="/etc/ssl/certs/ca-certificates.crt")
# Loopback, private, link-local, multicast and unspecified destinations are refused in every mode, except
# these: addresses or CIDR networks, each optionally with ":port" (e.g. 127.0.0.1:8443 in tests).
EGRESS_PRIVATE_ALLOWED = env.list("EGRESS_PRIVATE_ALLOWED", default=[])
# How long the proxy keeps a sandbox's policy (its session's credentials, its environment's networking) when
# no notice came: on PostgreSQL each change to one is announced at its commit (vault/egress/notices.py).
EGRESS_CACHE_SECONDS = env.float("EGRESS_CACHE_SECONDS", default=5.0)
# Responses up to this size are buffered and scrubbed whole; longer ones are scrubbed as they stream.
EGRESS_BUFFER_BYTES = env.int("EGRESS_BUFFER_BYTES", default=16 * 1024 * 1024)
# A CA file the proxy trusts for upstream servers instead of the system's (tests' local HTTPS servers).
EGRESS_UPSTREAM_CA = env("EGRESS_UPSTREAM_CA", default="")

# The proxy's door for the platform's own processes (kernel/egress.py). EGRESS_HARNESS_URL set: the harness
# reaches MCP servers, and the worker clones a session's repositories, only through it; the proxy attaches the
# session's credential for the URL (the workers never hold one). They speak for a session with
# EGRESS_HARNESS_TOKEN and trust the proxy's CA, EGRESS_CA_FILE, for https. The proxy listens for them at
# EGRESS_HARNESS_LISTEN (host:port; never on the sandboxes' network). Empty URL: direct connections, so only
# MCP servers and repositories needing no credential work.
EGRESS_HARNESS_URL = env("EGRESS_HARNESS_URL", default="")
EGRESS_HARNESS_LISTEN = env("EGRESS_HARNESS_LISTEN", default="127.0.0.1:3129")
EGRESS_HARNESS_TOKEN = env("EGRESS_HARNESS_TOKEN", default="")
EGRESS_CA_FILE = env("EGRESS_CA_FILE", default="")
# An mcp_oauth token this close to its expires_at is refreshed before the request that would use it.
EGRESS_REFRESH_MARGIN_SECONDS = env.float("EGRESS_REFRESH_MARGIN_SECONDS", default=60.0)

# --- Self-hosted work queue (sandboxes/work_queue.py) ---------------------------------------------------------
# A work item acked but never heartbeated goes back to the queue after WORK_START_TIMEOUT_SECONDS (the SDK's
# poller acks before its worker's first heartbeat, so a worker dying in between would strand it). A lease
# lasts WORK_LEASE_TTL_SECONDS from each heartbeat unless the heartbeat asks another desired_ttl_seconds
# (WORK_MIN_TTL_SECONDS to WORK_MAX_TTL_SECONDS); an active item whose lease ran out goes back to the queue,
# and a stopping one is stopped. Beat looks for such items every WORK_SWEEP_SECONDS; every poll looks too.
WORK_START_TIMEOUT_SECONDS = env.float("WORK_START_TIMEOUT_SECONDS", default=30.0)
WORK_LEASE_TTL_SECONDS = env.int("WORK_LEASE_TTL_SECONDS", default=90)
WORK_MIN_TTL_SECONDS = env.int("WORK_MIN_TTL_SECONDS", default=2)
WORK_MAX_TTL_SECONDS = env.int("WORK_MAX_TTL_SECONDS", default=3600)
WORK_SWEEP_SECONDS = env.float("WORK_SWEEP_SECONDS", default=5.0)
# The hooks an item's end (lost or stopped) leaves run after its commit, in the process that noticed it; a sweep
# runs those not run WORK_SETTLE_GRACE_SECONDS later (that process died). A lost item waits for them.
WORK_SETTLE_GRACE_SECONDS = env.float("WORK_SETTLE_GRACE_SECONDS", default=3.0)

# --- MCP tools (harness.mcp) -------------------------------------------------------------------------------
# One listing or call, connection included; and how long a session's listing of a server is reused.
MCP_TIMEOUT_SECONDS = env.float("MCP_TIMEOUT_SECONDS", default=30.0)
MCP_TOOLS_TTL_SECONDS = env.float("MCP_TOOLS_TTL_SECONDS", default=30.0)
# A brain process keeps a session's MCP session with a server open this long after its last call.
MCP_SESSION_IDLE_SECONDS = env.float("MCP_SESSION_IDLE_SECONDS", default=60.0)
# The most text (and image data) of one MCP tool result that the log keeps; the rest is cut with a note.
MCP_RESULT_MAX_CHARS = env.int("MCP_RESULT_MAX_CHARS", default=100_000)
