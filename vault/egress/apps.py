"""The apps the egress proxy loads: their models only.

The proxy reads the models of these apps (and those they point to), but runs none of their start-up code:
their `ready()` registers hooks for the web server and the workers (the harness's imports the MCP SDK, which
the proxy's virtualenv does not have) and would only slow the proxy's start or break it.
"""

from __future__ import annotations

from django.apps import AppConfig


class KernelModels(AppConfig):
    name = "kernel"
    label = "workbench"


class SessionsModels(AppConfig):
    name = "sessions"
    label = "agent_sessions"


class HarnessModels(AppConfig):
    name = "harness"


class SandboxesModels(AppConfig):
    name = "sandboxes"


class VaultModels(AppConfig):
    name = "vault"
