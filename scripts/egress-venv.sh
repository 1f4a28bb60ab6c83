#!/usr/bin/env bash
# The egress proxy's own virtualenv, .venv-egress: mitmproxy and what the proxy needs to read the Django
# models and write the audit trail. Idempotent: does nothing when the stamp is newer than this script.
#
# Why a second venv: mitmproxy 11.0.2 pins h11<=0.14, asgiref<=3.8.1 and cryptography<44.1, and the app's
# httpx/httpcore needs h11>=0.16. What resolves here: Django 5.2 (asgiref>=3.8.1, so 3.8.1 exactly),
# psycopg 3 with its pool, django-environ, cryptography 44.0 (X25519 and AES-GCM, all vault/crypto.py
# uses), the docker SDK (sandboxes/provisioning imports the provider package) and Celery with its Redis client
# (the workbench package imports its Celery app), neither of which the proxy calls.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-egress
stamp=$venv/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt "$0" ]; then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "egress-venv: creating $venv"
  python3 -m venv "$venv"
fi
echo "egress-venv: installing the proxy's packages into $venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-warn-script-location \
  "mitmproxy==11.0.2" \
  "django>=5.2,<5.3" \
  "django-environ>=0.11,<1" \
  "psycopg[binary,pool]>=3.2,<4" \
  "docker>=7.1,<8" \
  "celery>=5.4,<6" \
  "redis>=5.0,<7"
"$venv/bin/python" -c "import mitmproxy, django, psycopg, environ, cryptography, celery, docker"
touch "$stamp"
