"""The pool queues its refill by the task's name, so the name must be the registered task's."""

from celery import current_app

from sandboxes import tasks
from sandboxes.pool import REFILL_TASK, queue_refill


def test_the_refill_the_pool_queues_by_name_is_the_registered_refill_task():
    registered = current_app.tasks[REFILL_TASK]
    assert registered.run.__module__ == tasks.__name__ and registered.run.__name__ == "refill_pool"


def test_queueing_a_refill_sends_that_task_with_the_environment(monkeypatch):
    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args: sent.append((name, args)))
    queue_refill("env_x")
    assert sent == [(REFILL_TASK, ("env_x",))]
