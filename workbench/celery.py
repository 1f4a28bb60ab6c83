import logging
import os
import sys

from celery import Celery
from celery.signals import beat_init, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")

app = Celery("workbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _sweep_work_queue(sender: Celery, **_: object) -> None:
    """Beat: the self-hosted work queue's sweep for lost workers, every WORK_SWEEP_SECONDS."""
    from django.conf import settings

    sender.add_periodic_task(
        settings.WORK_SWEEP_SECONDS, sender.signature("sandboxes.tasks.sweep_work"), name="sweep-work"
    )


@worker_init.connect
def _refuse_insecure_secret_key_worker(**_: object) -> None:
    _refuse_insecure_secret_key("Celery worker")


@beat_init.connect
def _refuse_insecure_secret_key_beat(**_: object) -> None:
    _refuse_insecure_secret_key("Celery beat")


def _refuse_insecure_secret_key(process: str) -> None:
    """Celery logs an exception a signal handler raises and goes on; only SystemExit stops it."""
    from workbench.secret_key import InsecureSecretKey, refuse_insecure_secret_key

    try:
        refuse_insecure_secret_key(process)
    except InsecureSecretKey as refused:
        raise SystemExit(str(refused)) from None


@worker_init.connect
def _warn_of_a_time_limit(sender: object, **_: object) -> None:
    """`--time-limit` or `--soft-time-limit` reaches the wakes too (they set none of their own): a turn longer
    than it would be cut off mid-step and counted as a crash."""
    limits = [getattr(sender, name, None) for name in ("time_limit", "soft_time_limit")]
    if any(limits):
        logging.getLogger(__name__).warning(
            "This worker has a time limit (hard %s s, soft %s s), which also cuts off any turn that lasts "
            "longer; start it without --time-limit and --soft-time-limit (brains renew their leases instead).",
            *limits,
        )


# How long a thread that wants the GIL waits before it asks the holder to give it up.
GIL_SWITCH_SECONDS = 0.001


@worker_init.connect
def _prefer_woken_threads(**_: object) -> None:
    """A worker runs its brains as threads that mostly wait on the network. A brain woken by a reply (the
    database, the model, the broker handing over a wake) should not wait Python's default 5 ms for a thread
    busy parsing another stream to give up the GIL."""
    sys.setswitchinterval(GIL_SWITCH_SECONDS)


@worker_init.connect
def _hold_local_sandboxes(**_: object) -> None:
    """Local sandboxes end once no process holds their root (sandboxes/providers/keeper.py): the worker's
    main process holds it for as long as the worker runs, not only the pool's children, which come and go."""
    from sandboxes.providers.local import default_root, hold_root

    hold_root(default_root())
