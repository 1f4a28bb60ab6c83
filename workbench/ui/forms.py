"""Forms parse what operators type into the bodies the services take; the services judge the rest."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.core.exceptions import ValidationError

from harness.registry import HARNESS_DESCRIPTIONS
from kernel.api.validation import MAX_BODY_DEPTH, check_body
from kernel.errors import Invalid

HARNESS_CHOICES = [(name, f"{name} — {description}") for name, description in HARNESS_DESCRIPTIONS.items()]
DEFAULT_TOOLS = [{"type": "agent_toolset_20260401"}]
DEFAULT_ENVIRONMENT = {"type": "cloud", "networking": {"type": "unrestricted"}}


class JSONText(forms.CharField):
    """A textarea holding JSON; a parse error names the line and column."""

    widget = forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "mono"})

    def __init__(self, *, expect: type = object, **kwargs: Any):
        self.expect = expect
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        return value if isinstance(value, str) or value is None else json.dumps(value, indent=2)

    def to_python(self, value: Any) -> Any:
        value = super().to_python(value)
        if value in ("", None):
            return None
        try:
            parsed = json.loads(value)
            check_body(parsed)
        except json.JSONDecodeError as error:
            raise ValidationError(
                f"This is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}.",
                code="json",
            ) from None
        except RecursionError:
            raise ValidationError(
                f"This JSON nests too deeply; at most {MAX_BODY_DEPTH} levels.", code="json"
            ) from None
        except Invalid as refused:
            raise ValidationError(refused.message, code="json") from None
        if self.expect is not object and not isinstance(parsed, self.expect):
            names: dict[type, str] = {list: "a JSON array […]", dict: "a JSON object {…}"}
            name = names.get(self.expect, self.expect.__name__)
            raise ValidationError(f"This must be {name}.", code="json_type")
        return parsed


class StartSessionForm(forms.Form):
    agent = forms.ChoiceField()
    environment = forms.ChoiceField()
    title = forms.CharField(required=False, max_length=500)
    message = forms.CharField(
        required=False,
        strip=False,
        label="First message (optional)",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Say hello, or /bash uname -a"}),
    )

    def __init__(
        self, *args: Any, agents: list[tuple[str, str]], environments: list[tuple[str, str]], **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["agent"]).choices = agents
        cast(forms.ChoiceField, self.fields["environment"]).choices = environments

    def service_args(self) -> dict[str, Any]:
        """The service's keyword arguments from the cleaned form."""
        data = self.cleaned_data
        args: dict[str, Any] = {"agent": data["agent"], "environment_id": data["environment"]}
        if data["title"]:
            args["title"] = data["title"]
        if data["message"].strip():
            args["initial_events"] = [
                {"type": "user.message", "content": [{"type": "text", "text": data["message"]}]}
            ]
        return args


class SendEventForm(forms.Form):
    """What the composer and the call cards post: one user event."""

    kind = forms.ChoiceField(
        choices=[(k, k) for k in ("message", "interrupt", "tool_confirmation", "custom_tool_result")]
    )
    text = forms.CharField(required=False, strip=False)
    call_id = forms.CharField(required=False)
    result = forms.ChoiceField(required=False, choices=[("allow", "allow"), ("deny", "deny")])
    deny_message = forms.CharField(required=False)
    is_error = forms.BooleanField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        if kind == "message" and not (data.get("text") or "").strip():
            raise ValidationError("Type a message first.")
        if kind in ("tool_confirmation", "custom_tool_result") and not data.get("call_id"):
            raise ValidationError("Which call does this answer? The form lost its call id; reload the page.")
        if kind == "tool_confirmation" and not data.get("result"):
            raise ValidationError("Choose allow or deny.")
        return data

    def event(self) -> dict[str, Any]:
        data = self.cleaned_data
        kind = data["kind"]
        if kind == "message":
            return {"type": "user.message", "content": [{"type": "text", "text": data["text"]}]}
        if kind == "interrupt":
            return {"type": "user.interrupt"}
        if kind == "tool_confirmation":
            event = {
                "type": "user.tool_confirmation",
                "tool_use_id": data["call_id"],
                "result": data["result"],
            }
            if data["result"] == "deny" and data["deny_message"].strip():
                event["deny_message"] = data["deny_message"].strip()
            return event
        return {
            "type": "user.custom_tool_result",
            "custom_tool_use_id": data["call_id"],
            "content": [{"type": "text", "text": data["text"] or ""}],
            "is_error": data["is_error"],
        }


class HarnessForm(forms.Form):
    harness = forms.ChoiceField(choices=[(name, name) for name in HARNESS_DESCRIPTIONS])


class ProvisionForm(forms.Form):
    name = forms.CharField(max_length=64, initial="main")


class AttachForm(forms.Form):
    sandbox = forms.CharField(max_length=40)
    name = forms.CharField(max_length=64, required=False)


class TransferForm(forms.Form):
    to_session = forms.CharField(max_length=40, label="Pass to session")


class ForkForm(forms.Form):
    at_seq = forms.IntegerField(min_value=0, label="Fork from event")
    harness = forms.ChoiceField(
        required=False, choices=[("", "the session's own"), *((name, name) for name in HARNESS_DESCRIPTIONS)]
    )
    title = forms.CharField(required=False, max_length=500)


class AgentForm(forms.Form):
    name = forms.CharField(max_length=256)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    model = forms.CharField(max_length=200, initial="claude-sonnet-5-5")
    system = forms.CharField(
        required=False, strip=False, label="System prompt", widget=forms.Textarea(attrs={"rows": 4})
    )
    harness = forms.ChoiceField(choices=HARNESS_CHOICES, initial="claude")
    context = JSONText(
        expect=dict,
        required=False,
        initial={"type": "full"},
        help_text='{"type": "full"}, {"type": "window", "last_events": 200} or '
        '{"type": "compaction", "trigger_events": 400, "keep_events": 100}',
    )
    tools = JSONText(
        expect=list,
        required=False,
        initial=DEFAULT_TOOLS,
        help_text="A JSON array of tools; the toolset gives bash, read, write, edit, glob, grep.",
    )
    mcp_servers = JSONText(expect=list, required=False, initial=[], label="MCP servers")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AgentForm:
        model = config.get("model") or {}
        return cls(
            initial={
                **{
                    key: config.get(key)
                    for key in ("name", "description", "system", "harness", "context", "tools", "mcp_servers")
                },
                "model": model.get("id") if isinstance(model, dict) else model,
            }
        )

    def service_args(self) -> dict[str, Any]:
        """The service's keyword arguments from the cleaned form."""
        data = self.cleaned_data
        return {
            "name": data["name"],
            "description": data["description"] or None,
            "model": data["model"],
            "system": data["system"] or None,
            "harness": data["harness"],
            "context": data["context"] or {"type": "full"},
            "tools": data["tools"] or [],
            "mcp_servers": data["mcp_servers"] or [],
        }


class EnvironmentForm(forms.Form):
    name = forms.CharField(max_length=255)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    config = JSONText(
        expect=dict,
        initial=DEFAULT_ENVIRONMENT,
        help_text='{"type": "cloud", "networking": …, "packages": …, "sandbox": {"provider", "image", '
        '"cpus", "memory_mb", "pids", "disk_mb", "warm_pool", "max_sandboxes", "idle_ttl_seconds", "provisioning", "speculative", '
        '"pool_repository"}}',
    )

    @classmethod
    def from_environment(cls, environment: Any) -> EnvironmentForm:
        return cls(
            initial={
                "name": environment.name,
                "description": environment.description,
                "config": environment.config,
            }
        )

    def service_args(self) -> dict[str, Any]:
        """The service's keyword arguments from the cleaned form."""
        data = self.cleaned_data
        return {"name": data["name"], "description": data["description"] or None, "config": data["config"]}


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=200, label="What is it for?")
    read_only = forms.BooleanField(required=False, label="Read-only (refused every write)")


class EnvironmentKeyForm(forms.Form):
    name = forms.CharField(max_length=200, label="Which worker or machine is it for?")


class VaultForm(forms.Form):
    display_name = forms.CharField(label="Name", max_length=255)


class CredentialForm(forms.Form):
    """One form for the three kinds; the fields a kind does not use are ignored, and the vault's rules
    (vault/rules.py) judge the rest. Secret fields are password inputs never filled from what is stored."""

    KINDS = [
        ("static_bearer", "Bearer token for an MCP server"),
        ("mcp_oauth", "OAuth access token for an MCP server"),
        ("environment_variable", "Secret for the sandbox (a placeholder variable)"),
    ]
    kind = forms.ChoiceField(choices=KINDS, label="Kind")
    display_name = forms.CharField(label="Name", required=False, max_length=255)
    mcp_server_url = forms.CharField(label="MCP server URL", required=False, max_length=2048)
    token = forms.CharField(
        label="Token",
        required=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="The bearer token, or the OAuth access token. Stored sealed; never shown again.",
    )
    expires_at = forms.CharField(label="Expires at (OAuth)", required=False, help_text="RFC 3339, optional.")
    secret_name = forms.CharField(label="Variable name", required=False, max_length=255)
    secret_value = forms.CharField(
        label="Secret value",
        required=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )
    allowed_hosts = forms.CharField(
        label="Hosts it may be sent to",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One per line (api.example.com, *.example.com, 192.0.2.1); empty: any host.",
    )
    in_body = forms.BooleanField(label="Also substitute it in request bodies", required=False)

    def auth(self) -> dict[str, Any]:
        data = self.cleaned_data
        kind = data["kind"]
        if kind == "environment_variable":
            hosts = [line.strip() for line in data["allowed_hosts"].splitlines() if line.strip()]
            return {
                "type": kind,
                "secret_name": data["secret_name"],
                "secret_value": data["secret_value"],
                "networking": {"type": "limited", "allowed_hosts": hosts}
                if hosts
                else {"type": "unrestricted"},
                "injection_location": {"header": True, "body": data["in_body"]},
            }
        if kind == "mcp_oauth":
            return {
                "type": kind,
                "mcp_server_url": data["mcp_server_url"],
                "access_token": data["token"],
                **({"expires_at": data["expires_at"]} if data["expires_at"] else {}),
            }
        return {"type": kind, "mcp_server_url": data["mcp_server_url"], "token": data["token"]}


class ReplaceSecretForm(forms.Form):
    secret = forms.CharField(
        label="New secret",
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        max_length=16_384,
    )
