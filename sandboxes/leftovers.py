"""`python -m sandboxes.leftovers`: the sandboxes of this deployment (their `workbench.deployment` label) that the
providers still hold, as `make run` says when it stops; they are kept for their sessions, and the next start
reaps those no live session holds any more (`said_at_start`, the line it prints then).

It reads the settings only and loads no app (no model, no row): it answers in a fraction of a second where
Django's start takes seconds, after the database has stopped too.
"""

from __future__ import annotations

import os

from django.conf import settings

from sandboxes.providers import held_by


def sandboxes(count: int) -> str:
    return "1 sandbox" if count == 1 else f"{count} sandboxes"


def kept_for(count: int) -> str:
    return "kept for its session" if count == 1 else "kept for their sessions"


def said_at_start(deployment: str, found: int, reaped: int) -> str:
    """What the reaping as `make run` starts did (sandboxes.reaper.reap_leftovers), in a line."""
    said = f"{found} found" if found else "none"
    if reaped:
        said += f", {reaped} reaped (no live session held them, or they were idle past their TTL)"
    if found > reaped:
        said += f", {found - reaped} {kept_for(found - reaped)}"
    return f"Sandboxes an earlier run left (deployment {deployment}): {said}."


def said_at_stop(deployment: str, held: dict[str, list[str]]) -> str:
    """What is left after a stop (provider name -> handles), and how to remove it now."""
    count = sum(len(handles) for handles in held.values())
    if not count:
        return f"Sandboxes left (deployment {deployment}): none."
    listed = "; ".join(
        f"{name}: {', '.join(sorted(h[:12] for h in handles))}" for name, handles in held.items()
    )
    said = (
        f"Sandboxes left (deployment {deployment}): {sandboxes(count)} {kept_for(count)} ({listed}). "
        "The next `make run` reaps those no live session holds by then."
    )
    if held.get("docker"):
        said += (
            "\nRemove them now with: docker rm -f $(docker ps -aq --filter "
            f"label=workbench.deployment={deployment})"
        )
    return said


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")
    deployment = settings.WORKBENCH_DEPLOYMENT
    held = {provider.name: list(handles) for provider, handles in held_by(deployment) if handles}
    print(said_at_stop(deployment, held))


if __name__ == "__main__":
    main()
