import os
import sys

from celery import Celery
from celery.signals import worker_init

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
