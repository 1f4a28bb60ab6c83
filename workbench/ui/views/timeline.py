"""The timeline's fragments, the composer, replay by slice and forking from an event."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST

from harness.services.fork import session_fork
from harness.services.lifecycle import session_send_events
from kernel.errors import DomainError
from sessions.selectors import get_events
from sessions.services import SessionNotFound
from workbench.ui import selectors
from workbench.ui.forms import ForkForm, SendEventForm
from workbench.ui.http import here, member, redirect_to, status_of
from workbench.ui.presenters import present
from workbench.ui.views.sessions import session_or_404

# The most events one fragment request returns.
MAX_SLICE = 500
# How long a rendered slice of new events is shared between pages, and how long such a slice is at most
# (see fragment; the larger slices of scrolling are rarely asked for twice).
FRAGMENT_SECONDS = 5
SHARED_SLICE = 50


def _int_or_none(value: str | None, name: str) -> int | None:
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"'{name}' must be an integer, not {value!r}.") from None


def parse_slice(text: str) -> tuple[int | None, int | None]:
    """`"120:180"`, `"-50:"`, `":100"` or `"7"` (one event) into slice bounds."""
    start, colon, stop = text.strip().partition(":")
    first = _int_or_none(start, "slice start")
    if not colon:
        if first is None:
            return None, None
        return first, (first + 1 if first != -1 else None)
    return first, _int_or_none(stop, "slice stop")


@member()
async def events_fragment(request: HttpRequest, session_id: str) -> HttpResponse:
    """Events [start:stop] as the timeline's <li> nodes: what the page loads as the operator scrolls,
    what it appends when the socket says new events exist, and what the replay player steps through.

    The hottest request of the UI (every watching page asks for every new event), so it reads on the
    shared pool's long-lived threads and their database connections, not on a new thread per request.
    """
    try:
        start = _int_or_none(request.GET.get("start"), "start")
        stop = _int_or_none(request.GET.get("stop"), "stop")
    except ValueError as error:
        return HttpResponse(str(error), status=400, content_type="text/plain")
    try:
        first, last, length, html = await database_sync_to_async(fragment, thread_sensitive=False)(
            session_id, start, stop
        )
    except SessionNotFound:
        return HttpResponse(f"No session with id {session_id!r}.", status=404, content_type="text/plain")
    response = HttpResponse(html)
    response["X-Slice-Start"], response["X-Slice-Stop"] = str(first), str(last)
    response["X-Session-Length"] = str(length)
    response["Cache-Control"] = "no-store"
    return response


def fragment(session_id: str, start: int | None, stop: int | None) -> tuple[int, int, int, str]:
    """The rendered slice, shared for a few seconds between the pages that ask for the same one.

    Every page watching a session asks for each new event as the socket announces it, all at once; a slice
    of the past never changes (the log is append-only), so one rendering serves them all. Only what a
    later event may change (a call shown as still waiting for its answer) could be stale, for at most
    FRAGMENT_SECONDS, and the page corrects that itself when the answer's node arrives.
    """
    key = f"ui:events:{session_id}:{start}:{stop}"
    absolute = start is not None and stop is not None and 0 <= start < stop <= start + SHARED_SLICE
    if absolute and (hit := cache.get(key)) is not None:
        return hit
    timeline = selectors.timeline_slice(session_id, start, stop, limit=MAX_SLICE)
    html = render_to_string(
        "ui/events/_events.html", {"timeline": timeline, "base": reverse("ui:session", args=[session_id])}
    )
    result = (timeline.start, timeline.stop, timeline.length, html)
    if absolute and timeline.stop == stop:
        cache.set(key, result, FRAGMENT_SECONDS)
    return result


@require_POST
@member()
def send_event(request: HttpRequest, session_id: str) -> HttpResponse:
    """One user event from the composer or a call card. Success shows up through the socket."""
    form = SendEventForm(request.POST)
    call_id = request.POST.get("call_id", "")
    template = "ui/events/_call_status.html" if call_id else "ui/sessions/_composer_status.html"
    if not form.is_valid():
        message = " ".join(str(error) for errors in form.errors.values() for error in errors)
        return render(request, template, {"error": message, "call_id": call_id}, status=400)
    try:
        session_send_events(session_id, events=[form.event()], actor=here(request).actor)
    except DomainError as error:
        return render(
            request, template, {"error": error.message, "call_id": call_id}, status=status_of(error)
        )
    notices = {
        "interrupt": "Interrupt sent.",
        "tool_confirmation": "Answer sent; the brain continues.",
        "custom_tool_result": "Result sent; the brain continues.",
        "message": "",
    }
    return render(
        request,
        template,
        {"notice": notices[form.cleaned_data["kind"]], "answered": bool(call_id), "call_id": call_id},
    )


@member()
def replay(request: HttpRequest, session_id: str) -> HttpResponse:
    session = session_or_404(session_id)
    error = ""
    try:
        if "slice" in request.GET:
            start, stop = parse_slice(request.GET["slice"])
        else:
            start = _int_or_none(request.GET.get("start"), "start")
            stop = _int_or_none(request.GET.get("stop"), "stop")
    except ValueError as problem:
        error, start, stop = str(problem), None, None
    first, last = selectors.resolve_slice(session.next_seq, start, stop)
    return render(
        request,
        "ui/sessions/replay.html",
        {
            "session": session,
            "start": first,
            "stop": last,
            "length": session.next_seq,
            "error": error,
            "fork_form": ForkForm(initial={"at_seq": first}),
        },
        status=400 if error else 200,
    )


@member()
def fork(request: HttpRequest, session_id: str) -> HttpResponse:
    """GET: the form, for event `?at=N`. POST: fork — the new session holds copies of events [0:N]."""
    session = session_or_404(session_id)
    form = ForkForm(request.POST or None, initial={"at_seq": request.GET.get("at", session.next_seq)})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            forked = session_fork(
                session.id,
                at_seq=data["at_seq"],
                harness=data["harness"] or None,
                title=data["title"] or None,
            )
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            return redirect_to(request, reverse("ui:session", args=[forked.id]))
    at = form["at_seq"].value()
    event = None
    try:
        at_seq = int(at)
        if 0 <= at_seq < session.next_seq:
            event = present(get_events(session.id, at_seq, at_seq + 1)[0])
    except (TypeError, ValueError, IndexError):
        pass
    template = "ui/sessions/_fork_form.html" if request.method == "POST" else "ui/sessions/fork.html"
    return render(
        request,
        template,
        {"session": session, "form": form, "event": event},
        status=400 if request.method == "POST" else 200,
    )
