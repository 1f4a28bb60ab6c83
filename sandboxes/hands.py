"""A session's hands: sandboxes it holds by name, provisioned on the first call that needs one.

`execute(name, input)` runs a toolset tool in one of them. A dead sandbox is a tool error, never a lost
session: the call that finds it dead says so, and the next call provisions a fresh one and says that too.
Hands can be attached, detached and passed to another session; every change is an event in the log of
each session it touches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from kernel.errors import Invalid, NotFound
from kernel.tenancy import audit, check_same
from sandboxes.models import Environment, Sandbox
from sandboxes.pool import leave_pool, pool_take
from sandboxes.providers import (
    Provider,
    Resources,
    SandboxError,
    SandboxGone,
    ToolFailed,
    ToolInputError,
)
from sandboxes.provisioning import SESSION_ENV, provider_name, provider_of, resources_for, session_env
from sandboxes.repositories import ClonesAhead, checkout_repositories, prepared_resources
from sandboxes.returns import give_back, returnable_mark, take_returned
from sessions import events
from sessions.models import Session
from sessions.services import SessionNotFound, emit_event

logger = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], Any]
DEFAULT_HAND = "main"
MAX_NAME_LENGTH: int = Sandbox._meta.get_field("name").max_length  # type: ignore[assignment]
# A session's hands that count toward its cap and hold their names.
LIVE = (Sandbox.Status.READY, Sandbox.Status.PROVISIONING)


SELF_HOSTED = "self_hosted"  # a worker's hold on a session (sandboxes/work_queue.py), not a provider's


def _log(session_id: str) -> Emit:
    return lambda event: emit_event(session_id, event)


def held(session_id: str) -> list[Sandbox]:
    """The live hands a session holds, the default one first."""
    return list(
        Sandbox.objects.filter(session_id=session_id, status=Sandbox.Status.READY).order_by("created_at")
    )


def _new_sandbox(environment: Environment, *, session: Session, name: str, labels: dict[str, Any]) -> Sandbox:
    """The session's new hand: one an earlier session of the environment returned unused
    (sandboxes/returns.py), one from its warm pool, or a row (provisioning) whose sandbox the caller then
    starts. Nothing slow: the session's row is locked meanwhile."""
    pooled = take_returned(environment, session=session, name=name) or pool_take(
        environment, session=session, name=name
    )
    if pooled is not None:
        # The brain's epoch, and `speculative` (unused, it is reaped sooner: sandboxes/reaper.py); its idle
        # time runs from the take, not from the refill.
        pooled.labels, pooled.last_used_at = {**pooled.labels, **labels}, timezone.now()
        if pooled.labels.get("prepared"):  # unusable until the session proved its access (`_take_prepared`)
            pooled.status = Sandbox.Status.PROVISIONING
        Sandbox.objects.filter(id=pooled.id).update(
            labels=pooled.labels, status=pooled.status, last_used_at=pooled.last_used_at
        )
        return pooled
    return Sandbox.objects.create(
        environment=environment,
        session=session,
        name=name,
        provider=provider_name(environment),
        labels=labels,
    )


def _give_up_stopped_brains_provisionings(session: Session) -> None:
    """The hands that earlier brains of the session were still provisioning when they stopped (a row stamped
    with a brain's lease epoch, older than the session's now), whatever their names, are given up: those
    brains died, or are refused at their next write, and each such row would otherwise keep its name taken and
    count toward the session's cap until the reaper's grace ran out, failing calls meanwhile. A brain's
    provisioning that started anyway ends its container itself, as its row is no longer provisioning; a dead
    brain's container is the reaper's. Rows without an epoch (an operator's, through the API) are left. The
    caller holds the lock."""
    Sandbox.objects.filter(
        session_id=session.id,
        status=Sandbox.Status.PROVISIONING,
        labels__lease_epoch__lt=session.lease_epoch,
    ).update(status=Sandbox.Status.DEAD)


def _check_name(name: str) -> None:
    if not name:
        raise Invalid(f"A sandbox needs a name of 1 to {MAX_NAME_LENGTH} characters; this one is empty.")
    if len(name) > MAX_NAME_LENGTH:
        raise Invalid(f"A sandbox name must be at most {MAX_NAME_LENGTH} characters, not {len(name)}.")
    if not name.isprintable():
        raise Invalid(f"A sandbox name must not hold control characters (such as newlines): {name!r}.")


def _refuse_self_hosted(session: Session) -> None:
    """A self-hosted environment's hands are its workers' machines: the platform provisions none there."""
    if (session.environment.config or {}).get("type") == "self_hosted":
        raise Invalid(
            f"Session {session.id} is in a self-hosted environment, whose hands are its workers' machines: "
            "no platform sandbox is provisioned or attached for it. Start a worker for the environment instead."
        )


def _check_room(session: Session, name: str | None) -> None:
    """`name` (when given) must be free, and the session under its environment's cap of live hands."""
    names = list(
        Sandbox.objects.filter(session_id=session.id, status__in=LIVE)
        .order_by("created_at")
        .values_list("name", flat=True)
    )
    if name is not None and name in names:
        raise Invalid(f"Session {session.id} already holds a sandbox named {name!r}.")
    asked = (session.environment.config.get("sandbox") or {}).get("max_sandboxes")
    cap = min(asked or settings.SANDBOX_MAX_PER_SESSION, settings.SANDBOX_MAX_PER_SESSION)
    if len(names) >= cap:
        raise Invalid(
            f"Session {session.id} holds as many sandboxes as it may ({cap}: its environment's "
            f"config.sandbox.max_sandboxes, at most SANDBOX_MAX_PER_SESSION={settings.SANDBOX_MAX_PER_SESSION}): "
            f"{', '.join(map(repr, names))}. Release one first: the release_sandbox tool, or "
            f"DELETE /v1/sessions/{session.id}/sandboxes/<sandbox id>.",
            code="sandbox_limit_reached",
        )


def sandbox_provision(
    session_id: str,
    *,
    name: str = DEFAULT_HAND,
    emit: Emit | None = None,
    by_brain: bool = False,
    speculative: bool = False,
) -> Sandbox:
    """A new hand for the session under `name`, which must be a free, valid name within the session's cap.

    `by_brain`: asked by the brain holding the session's lease, which first gives up what stopped brains of
    the session left provisioning, under any name. `speculative`: before any call asked for it
    (`sandbox_provision_ahead`); labelled so until a call uses it."""
    emit = emit or _log(session_id)
    _check_name(name)
    with transaction.atomic():
        # The session row's lock keeps two provisionings racing for one name or the last place from both
        # getting it; the new row, committed before its sandbox starts, counts toward the cap from then on.
        session = (
            Session.objects.select_for_update(no_key=True, of=("self",))
            .select_related("environment")
            .get(id=session_id)
        )
        _refuse_self_hosted(session)
        if by_brain:
            _give_up_stopped_brains_provisionings(session)
        _check_room(session, name)
        labels: dict[str, Any] = {"lease_epoch": session.lease_epoch} if by_brain else {}
        if speculative:
            labels["speculative"] = True
        sandbox = _new_sandbox(session.environment, session=session, name=name, labels=labels)
    taken = bool(sandbox.labels.get("from_pool") or sandbox.labels.get("from_returns"))
    if taken and sandbox.labels.get("prepared"):
        _take_prepared(sandbox, session, emit, speculative=speculative)
        return sandbox
    ahead = None
    if sandbox.status == Sandbox.Status.PROVISIONING:
        provider = provider_of(sandbox)
        if session.resources:  # cloned while the sandbox starts
            ahead = ClonesAhead(session.resources, session_id=session.id)
        resources = resources_for(session.environment, sandbox)
        variables = bool(resources.env.get(SESSION_ENV))  # the names of the session's, if it has any
        try:
            handle = _started(provider, resources, ahead)
        except SandboxError as error:
            Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
            emit(events.sandbox_failed(name, str(error)))
            raise
        if ahead is not None and ahead.in_image is not None:  # for the operator (and bench/ttft)
            sandbox.labels = {**sandbox.labels, "checkout_image": True}
        # Only if no one gave the row up meanwhile (a newer brain of the session, the reaper's grace).
        if not Sandbox.objects.filter(id=sandbox.id, status=Sandbox.Status.PROVISIONING).update(
            handle=handle, status=Sandbox.Status.READY, labels=sandbox.labels
        ):
            with suppress(SandboxError):
                provider.terminate(handle)
            raise SandboxError(f"the sandbox {sandbox.id} was given up while it was being provisioned")
        sandbox.handle, sandbox.status = handle, Sandbox.Status.READY
    else:
        # A pooled or returned sandbox was made for no session (or one gone): its shell gets this one's
        # variables (placeholders). No call ever ran in it, so no result says the shell is new.
        env = session_env(sandbox)
        variables = bool(env)
        if variables:
            provider_of(sandbox).reset(sandbox.handle, env=env, unused=True)
    emit(events.sandbox_provisioned(sandbox.id, name, provider=sandbox.provider, **_taken_from(sandbox)))
    if session.resources:
        checkout_repositories(
            provider_of(sandbox), sandbox.handle, session.resources, emit, session_id=session.id, ahead=ahead
        )
    placed = ahead.placed if ahead else {}
    if speculative and (mark := returnable_mark(session.id, session.resources, placed, variables=variables)):
        _mark_returnable(sandbox, mark)
    return sandbox


def _taken_from(sandbox: Sandbox) -> dict[str, bool]:
    """Where a new hand came from, as its `sandbox.provisioned` event says."""
    return {
        "pooled": bool(sandbox.labels.get("from_pool")),
        "returned": bool(sandbox.labels.get("from_returns")),
    }


def _mark_returnable(sandbox: Sandbox, mark: dict[str, Any]) -> None:
    """Label a hand provisioned ahead as one that may go back to its environment if no call uses it
    (sandboxes/returns.py); a hand no longer ready is left as it is."""
    sandbox.labels = {**sandbox.labels, "returnable": mark}
    Sandbox.objects.filter(id=sandbox.id, status=Sandbox.Status.READY).update(labels=sandbox.labels)


def _started(provider: Provider, resources: Resources, ahead: ClonesAhead | None) -> str:
    """Start the sandbox: from the image that holds its first repository's checkout when `ahead` finds one
    (sandboxes/repositories.py), else (or should that image be gone meanwhile) from its own."""
    image = ahead.sandbox_image(provider, resources.image) if ahead is not None else resources.image
    if ahead is not None and image != resources.image:
        try:
            return provider.provision(replace(resources, image=image))
        except SandboxError as error:
            logger.warning("starting a sandbox from its own image, not its checkout image: %s", error)
            ahead.in_image = None
    return provider.provision(resources)


def _take_prepared(sandbox: Sandbox, session: Session, emit: Emit, *, speculative: bool) -> None:
    """Hand over a pooled or returned sandbox that came with a repository checked out
    (sandboxes/repositories.py): it was taken provisioning (`_new_sandbox`), so no call, attach, detach or
    transfer reaches it until the session proved its access to that checkout or the checkout is gone; then
    it is ready. Whatever fails meanwhile (the toolbox's reset, a lost lease, git, the removal) discards it,
    container and all. Taken ahead of a call with the checkout kept, it may go back unused as it came."""
    provider = provider_of(sandbox)
    prepared = sandbox.labels["prepared"]
    try:
        if variables := session_env(sandbox):
            provider.reset(sandbox.handle, env=variables, unused=True)
        emit(
            events.sandbox_provisioned(
                sandbox.id, sandbox.name, provider=sandbox.provider, **_taken_from(sandbox)
            )
        )
        kept = checkout_repositories(
            provider, sandbox.handle, session.resources, emit, session_id=session.id, prepared=prepared
        )
    except BaseException as error:
        _discard(sandbox, f"it came from the warm pool with a repository checked out, and {error}", emit)
        raise
    # Only if no one gave the row up meanwhile (a newer brain of the session, the reaper's grace). `kept` is
    # for the operator (and bench/ttft): whether the pool's checkout saved the session its clone.
    labels = {**sandbox.labels, "prepared": {**prepared, "kept": kept}}
    if speculative and kept and len(prepared_resources(session.resources)) == 1:
        # Its one resource is the checkout it came with (`returns.take_returned` or the pool's repository).
        labels["returnable"] = {"session": session.id, "prepared": prepared, "variables": bool(variables)}
    if not Sandbox.objects.filter(id=sandbox.id, status=Sandbox.Status.PROVISIONING).update(
        status=Sandbox.Status.READY, labels=labels
    ):
        with suppress(SandboxError):
            provider.terminate(sandbox.handle)
        raise SandboxError(f"the sandbox {sandbox.id} was given up while its repository was being checked")
    sandbox.labels, sandbox.status = labels, Sandbox.Status.READY


def _discard(sandbox: Sandbox, reason: str, emit: Emit) -> None:
    """A new hand no call may use: dead, its container removed, and the log says why (if it still can)."""
    Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
    with suppress(SandboxError):
        provider_of(sandbox).terminate(sandbox.handle)
    try:
        emit(events.sandbox_failed(sandbox.name, reason, sandbox_id=sandbox.id))
    except Exception:  # a lost lease: the next brain finds the row dead
        logger.warning("sandbox %s discarded (%s); the log could not say so", sandbox.id, reason)


def sandbox_provision_ahead(session_id: str, *, always: bool, emit: Emit) -> Sandbox | None:
    """The session's default hand, provisioned before a tool call asks for it, by the brain holding the lease
    (harness/speculation.py) while its model thinks: if the session holds no sandbox and is not self-hosted,
    and (unless `always`) has resources its sandbox is prepared with, which take time. None otherwise."""
    session = Session.objects.select_related("environment").filter(id=session_id).first()
    if session is None or (session.environment.config or {}).get("type") == "self_hosted":
        return None
    if not always and not prepared_resources(session.resources):
        return None
    if held(session_id):
        return None
    if (starting := provisionings_in_flight()) >= settings.SPECULATIVE_MAX_IN_FLIGHT:
        # Optional work is what goes first when the engine falls behind: each sandbox started ahead that no
        # call uses costs the machine about a core-second, and past its capacity they queued for minutes.
        logger.info("session %s: not provisioning ahead, %d sandboxes are starting", session_id, starting)
        return None
    try:
        return sandbox_provision(session_id, emit=emit, by_brain=True, speculative=True)
    except Invalid:  # the name or the last place was taken meanwhile: the tool call will say so
        return None


def provisionings_in_flight() -> int:
    """The sandboxes of this deployment being provisioned now, for any session or pool."""
    return Sandbox.objects.filter(status=Sandbox.Status.PROVISIONING).count()


def _used(sandbox: Sandbox) -> None:
    """A call ran in `sandbox`: it is no longer idle, nor (if it was) an unused speculative sandbox."""
    used: dict[str, Any] = {"last_used_at": timezone.now()}
    if sandbox.labels.get("speculative"):
        used["labels"] = {**sandbox.labels, "speculative": False}
    Sandbox.objects.filter(id=sandbox.id).update(**used)


def _begin_call(sandbox: Sandbox, session_id: str) -> bool:
    """Before a call runs in a hand provisioned ahead, mark it used, while the session still holds it: from
    then on it never goes back to its environment (sandboxes/returns.py). Whether the session holds it."""
    if not sandbox.labels.get("speculative"):
        return True
    sandbox.labels = {**sandbox.labels, "speculative": False}
    return bool(
        Sandbox.objects.filter(id=sandbox.id, session_id=session_id, status=Sandbox.Status.READY).update(
            labels=sandbox.labels
        )
    )


def _hand(session_id: str, name: str | None) -> Sandbox | None:
    hands = held(session_id)
    if name is None:
        return hands[0] if hands else None
    return next((hand for hand in hands if hand.name == name), None)


def execute(
    session_id: str, name: str, input: dict[str, Any], *, emit: Emit, cancelled: Callable[[], bool]
) -> tuple[str, bool]:
    """Run toolset tool `name` in one of the session's hands (`input["sandbox"]`, else the default).

    Returns (text, is_error). The first call provisions the default hand.
    """
    wanted = input.pop("sandbox", None)
    sandbox = _hand(session_id, wanted)
    note = ""
    try:
        if sandbox is None:
            if wanted is not None and held(session_id):
                names = ", ".join(hand.name for hand in held(session_id))
                return f"This session holds no sandbox named {wanted!r}; it holds: {names}.", True
            hand_name = wanted or DEFAULT_HAND
            # What the model knew of: a sandbox provisioned ahead that failed before any call used it is not.
            earlier = {
                status
                for status, labels in Sandbox.objects.filter(
                    session_id=session_id,
                    name=hand_name,
                    status__in=(Sandbox.Status.DEAD, Sandbox.Status.PROVISIONING),
                ).values_list("status", "labels")
                if not labels.get("speculative")
            }
            sandbox = sandbox_provision(session_id, name=hand_name, emit=emit, by_brain=True)
            if Sandbox.Status.PROVISIONING in earlier:
                note = (
                    f"[a new sandbox {sandbox.id} was provisioned: the one an earlier, stopped brain of this "
                    "session was provisioning was given up]\n"
                )
            elif earlier:
                note = f"[a new sandbox {sandbox.id} was provisioned: the previous one had died]\n"
        if not _begin_call(sandbox, session_id):
            return (
                f"The sandbox {sandbox.name!r} left this session before the call ran (the session ended, "
                "and it went back to its environment unused); nothing ran. Start a new session to go on."
            ), True
        text = provider_of(sandbox).execute(
            sandbox.handle, name, input, timeout_s=settings.TOOL_TIMEOUT_SECONDS, cancelled=cancelled
        )
        _used(sandbox)
        return note + text, False
    except SandboxGone as gone:
        assert sandbox is not None
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
        emit(events.sandbox_failed(sandbox.name, str(gone), sandbox_id=sandbox.id))
        return (
            f"The sandbox {sandbox.name!r} died during this call: {gone}. Its effect is unknown; the next "
            "call will provision a new sandbox."
        ), True
    except (ToolFailed, ToolInputError) as failure:
        if sandbox is not None:
            _used(sandbox)
        return note + str(failure), True
    except Invalid as refused:  # a hand it may not provision: a bad name, or the session's cap
        return refused.message, True
    except SandboxError as error:
        return f"The sandbox provider could not run this call: {error}", True


def _free_name(session_id: str, wanted: str) -> str:
    """`wanted`, or `wanted-2`, `-3`… if the session holds that name; shortened to fit the name's length."""
    taken = {hand.name for hand in held(session_id)}
    name, n = wanted[:MAX_NAME_LENGTH], 2
    while name in taken:
        suffix = f"-{n}"
        name, n = wanted[: MAX_NAME_LENGTH - len(suffix)] + suffix, n + 1
    return name


def _live(sandbox_id: str) -> Sandbox:
    sandbox = Sandbox.objects.select_for_update().filter(id=sandbox_id).first()
    if sandbox is None:
        raise NotFound("sandbox", sandbox_id)
    if sandbox.provider == SELF_HOSTED:
        raise Invalid(
            f"Sandbox {sandbox_id} is a self-hosted worker's hold on its session's work item "
            f"({sandbox.handle}): it cannot change hands. Terminate it to ask the worker to stop."
        )
    if sandbox.status != Sandbox.Status.READY:
        raise Invalid(f"Sandbox {sandbox_id} is {sandbox.status}; only a ready sandbox can change hands.")
    return sandbox


def _receiver(session_id: str) -> Session:
    """The session a hand is given to, locked (as provisioning locks it) and checked to have room for it."""
    session = (
        Session.objects.live()
        .select_for_update(no_key=True, of=("self",))
        .select_related("environment")
        .filter(id=session_id)
        .first()
    )
    if session is None:
        raise NotFound("session", session_id)
    if session.status == Session.Status.TERMINATED:
        raise Invalid(f"Session {session_id} is terminated; it cannot take a sandbox.")
    _refuse_self_hosted(session)
    _check_room(session, None)
    return session


def _same_workspace(sandbox: Sandbox, session: Session, missing: NotFound) -> None:
    """Hands stay home: a sandbox moves only between sessions of its own workspace. Another workspace's
    object is answered as a missing one, so ids do not leak."""
    home = (
        Environment.objects.filter(id=sandbox.environment_id).values_list("workspace_id", flat=True).first()
    )
    check_same(session.workspace_id, home or "", missing)


def _handed_over(sandbox: Sandbox, session_id: str) -> Sandbox:
    """A hand that changed sessions gets its toolbox verified and a new shell (`Provider.reset`) before its
    new holder uses it; after the transaction, as it may wait seconds for a call of the previous holder to
    stop. A hand that fails it is not used: it is marked dead, and the session's next call gets a new one."""
    try:
        provider_of(sandbox).reset(sandbox.handle, env=session_env(sandbox))
    except (SandboxError, ToolFailed) as error:
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.DEAD)
        emit_event(
            session_id,
            events.sandbox_failed(
                sandbox.name,
                f"its toolbox could not be verified after it changed hands: {error}",
                sandbox_id=sandbox.id,
            ),
        )
        sandbox.refresh_from_db()
    return sandbox


def sandbox_attach(
    sandbox_id: str, session_id: str, *, name: str | None = None, actor: str = "system"
) -> Sandbox:
    """Give a free sandbox of the session's workspace to the session."""
    with transaction.atomic():
        sandbox = _live(sandbox_id)
        receiver = _receiver(session_id)
        _same_workspace(sandbox, receiver, NotFound("sandbox", sandbox_id))
        if sandbox.session_id is not None:
            raise Invalid(
                f"Sandbox {sandbox_id} is held by session {sandbox.session_id}; detach it or "
                "transfer it from there."
            )
        if sandbox.labels.get("pooled") and sandbox.labels.get("prepared"):
            raise Invalid(
                f"Sandbox {sandbox_id} is in its environment's warm pool with a repository checked out, "
                "which a session keeps only once it proved its access to it: it is handed out only by "
                "provisioning. Attach another sandbox, or let the session provision one."
            )
        if sandbox.labels.get("returned"):
            raise Invalid(
                f"Sandbox {sandbox_id} was provisioned ahead for a session that ended without using it, and "
                "waits for the next session of its environment with the same resources, which keeps its "
                "checkout only once it proved its access: it is handed out only by provisioning. Attach "
                "another sandbox, or let the session provision one."
            )
        if name is not None:
            _check_name(name)
        sandbox.session_id, sandbox.name = session_id, _free_name(session_id, name or sandbox.name)
        sandbox.last_used_at = timezone.now()  # a hand changing sessions starts its idle time again
        sandbox.save(update_fields=["session", "name", "last_used_at"])
        emit_event(session_id, events.sandbox_attached(sandbox.id, sandbox.name))
        audit(receiver.workspace_id, actor, "sandbox.attached", sandbox.id, session=session_id)
    return _handed_over(sandbox, session_id)


def sandbox_detach(sandbox_id: str, *, emit: Emit | None = None) -> Sandbox:
    """Take a sandbox from its session; it stays alive, free for another."""
    with transaction.atomic():
        sandbox = _live(sandbox_id)
        if sandbox.session_id is None:
            raise Invalid(f"Sandbox {sandbox_id} is not attached to any session.")
        (emit or _log(sandbox.session_id))(events.sandbox_detached(sandbox.id, sandbox.name))
        leave_pool(sandbox)
        sandbox.session_id, sandbox.last_used_at = None, timezone.now()
        sandbox.save(update_fields=["session", "labels", "last_used_at"])
    return sandbox


def sandbox_transfer(
    sandbox_id: str, to_session_id: str, *, emit: Emit | None = None, actor: str = "system"
) -> Sandbox:
    """Pass a live sandbox, with its files and processes, from its session to another; both logs say so.

    The processes the giver left running go on in the taker's hands, by design: they run as the same
    sandbox user as the taker's commands and can change what those commands find and print. What they
    cannot do is answer for the toolbox: the taker's calls reach the real one, with a new shell.
    """
    with transaction.atomic():
        sandbox = _live(sandbox_id)
        source = sandbox.session_id
        if source is None:
            raise Invalid(f"Sandbox {sandbox_id} is not attached; attach it instead of transferring it.")
        if source == to_session_id:
            raise Invalid(f"Sandbox {sandbox_id} is already held by session {to_session_id}.")
        receiver = _receiver(to_session_id)
        _same_workspace(sandbox, receiver, NotFound("session", to_session_id))
        (emit or _log(source))(events.sandbox_detached(sandbox.id, sandbox.name, to_session=to_session_id))
        sandbox.session_id, sandbox.name = to_session_id, _free_name(to_session_id, sandbox.name)
        sandbox.last_used_at = timezone.now()
        sandbox.save(update_fields=["session", "name", "last_used_at"])
        emit_event(
            to_session_id,
            events.sandbox_attached(sandbox.id, sandbox.name, from_session=source),
        )
        audit(
            receiver.workspace_id,
            actor,
            "sandbox.passed",
            sandbox.id,
            from_session=source,
            to_session=to_session_id,
        )
    return _handed_over(sandbox, to_session_id)


def sandbox_release(sandbox_id: str, *, emit: Emit | None = None) -> Sandbox:
    """End a hand whose session ended (the reaper's end for it): one provisioned ahead that no call used goes
    back to its environment for the next session, where sandboxes/returns.py allows; any other is
    terminated."""
    sandbox = Sandbox.objects.select_related("environment").filter(id=sandbox_id).first()
    if sandbox is None:
        raise NotFound("sandbox", sandbox_id)
    if sandbox.session_id is None:  # free, or returned by a release racing this one: not this one's to end
        return sandbox
    if give_back(sandbox, emit or _log(sandbox.session_id)):
        sandbox.refresh_from_db()
        return sandbox
    # Ended here only while its session still holds it: a release racing this one (the reaper's and the
    # session's end) may have returned it meanwhile, and one of the two updates wins.
    still_held = Sandbox.objects.filter(id=sandbox.id, session_id=sandbox.session_id)
    if not still_held.exclude(status=Sandbox.Status.TERMINATED).update(status=Sandbox.Status.DEAD):
        sandbox.refresh_from_db()
        return sandbox
    return sandbox_terminate(sandbox_id, emit=emit)


def sandbox_terminate(sandbox_id: str, *, emit: Emit | None = None, actor: str = "system") -> Sandbox:
    sandbox = Sandbox.objects.select_related("environment").filter(id=sandbox_id).first()
    if sandbox is None:
        raise NotFound("sandbox", sandbox_id)
    if actor != "system":  # the reaper's and the pools' ends are not admin actions
        audit(
            sandbox.environment.workspace_id,
            actor,
            "sandbox.terminated",
            sandbox.id,
            session=sandbox.session_id,
        )
    if sandbox.provider == SELF_HOSTED:
        return _release_worker(sandbox)
    if sandbox.status in (Sandbox.Status.READY, Sandbox.Status.PROVISIONING, Sandbox.Status.DEAD):
        try:
            if sandbox.handle:
                provider_of(sandbox).terminate(sandbox.handle)
        except SandboxError as error:
            logger.warning("terminating %s: %s (the reaper will retry)", sandbox.id, error)
        Sandbox.objects.filter(id=sandbox.id).update(status=Sandbox.Status.TERMINATED)
        if sandbox.session_id:
            # A deleted session's log takes no more events (the reaper ends its sandboxes after it is deleted).
            with suppress(SessionNotFound):
                (emit or _log(sandbox.session_id))(events.sandbox_terminated(sandbox.id, sandbox.name))
    sandbox.refresh_from_db()
    return sandbox


def _release_worker(sandbox: Sandbox) -> Sandbox:
    """A self-hosted worker's hand is no container: ending it asks the worker to stop the session's work item
    (which releases the hand and says so in the log)."""
    from sandboxes.work_queue import work_stop_for_session  # the queue builds on this module's models

    if sandbox.session_id and sandbox.status == Sandbox.Status.READY:
        work_stop_for_session(sandbox.session_id)
    Sandbox.objects.filter(id=sandbox.id, status__in=(Sandbox.Status.READY, Sandbox.Status.DEAD)).update(
        status=Sandbox.Status.TERMINATED
    )
    sandbox.refresh_from_db()
    return sandbox


def sandbox_json(sandbox: Sandbox) -> dict[str, Any]:
    return {
        "id": sandbox.id,
        "type": "sandbox",
        "name": sandbox.name,
        "status": sandbox.status,
        "provider": sandbox.provider,
        "environment_id": sandbox.environment_id,
        "session_id": sandbox.session_id,
        "created_at": sandbox.created_at.isoformat(),
        "last_used_at": sandbox.last_used_at.isoformat(),
    }
