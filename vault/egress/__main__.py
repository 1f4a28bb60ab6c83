"""`python -m vault.egress`: run the egress proxy (from .venv-egress, with VAULT_KEY_FILE or VAULT_KEYS).

`python -m vault.egress network` (from the app's .venv, which has the Docker SDK and the socket) makes the
sandboxes' internal network and its firewall rules, then exits: the proxy listens on that network's bridge.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import django
from django.conf import settings

# What the proxy loads: the models it reads (and those they point to), without the web server's apps
# (daphne, channels), which its virtualenv does not have, and without the apps' start-up hooks (apps.py).
EGRESS_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "vault.egress.apps.KernelModels",
    "vault.egress.apps.SessionsModels",
    "vault.egress.apps.HarnessModels",
    "vault.egress.apps.SandboxesModels",
    "vault.egress.apps.VaultModels",
]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m vault.egress", description=__doc__)
    parser.add_argument("command", nargs="?", choices=["serve", "network"], default="serve")
    parser.add_argument("--listen-host", help="listen here instead of the sandboxes' bridge (EGRESS_SUBNET)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")
    settings.INSTALLED_APPS = EGRESS_APPS
    django.setup()
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    # Both modules import the models, which load only after django.setup().
    if args.command == "network":
        from sandboxes.providers.docker import DockerProvider
        from sandboxes.provisioning import egress_route

        DockerProvider().prepare_egress(egress_route())
        print(f"egress: network {settings.EGRESS_NETWORK} on {settings.EGRESS_SUBNET} is ready")
        return
    from vault.egress.server import serve

    asyncio.run(serve(listen_host=args.listen_host))


if __name__ == "__main__":
    main()
