"""Login throttling (django-axes) on both login pages, the UI's and the admin's: after LOGIN_FAILURE_LIMIT wrong
passwords for one username from one address, that pair is refused, right password included, with a page that
says why and for how long, until the cool-off has passed since its last try."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import operator_of

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-operator-password"
PAGES = ["/login/", "/admin/login/"]


@pytest.fixture
def operator() -> User:
    return operator_of(User.objects.create_superuser("operator", password=PASSWORD))


def attempt(page: str, password: str, *, username: str = "operator", address: str = "10.0.0.1") -> object:
    return Client(REMOTE_ADDR=address).post(page, {"username": username, "password": password})


def logged_in(response: object) -> bool:
    return response.status_code == 302 and "sessionid" in response.cookies  # type: ignore[attr-defined]


def fail_up_to_the_limit(page: str, **where: str) -> None:
    """LOGIN_FAILURE_LIMIT wrong passwords: the form again with its error, and at the last the lockout."""
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = attempt(page, "wrong", **where)
        assert response.status_code == 200 and not logged_in(response)
    assert attempt(page, "wrong", **where).status_code == 429


@pytest.mark.parametrize("page", PAGES)
def test_after_the_failure_limit_even_the_right_password_is_refused_with_a_page_saying_why(operator, page):
    fail_up_to_the_limit(page)
    response = attempt(page, PASSWORD)
    assert response.status_code == 429 and not logged_in(response)
    text = response.content.decode()
    assert "Too many failed logins" in text
    assert f"There were {settings.AXES_FAILURE_LIMIT} failed logins for <strong>operator</strong>" in text
    assert "0:15:00" in text  # the default cool-off, 15 minutes


def test_the_limit_holds_across_both_login_pages(operator):
    for page in PAGES:
        for _ in range(settings.AXES_FAILURE_LIMIT // 2 + 1):
            attempt(page, "wrong")
    assert attempt("/login/", PASSWORD).status_code == 429


def test_the_lock_is_of_the_username_at_that_address_only(operator):
    operator_of(User.objects.create_user("colleague", password=PASSWORD, is_staff=True))
    fail_up_to_the_limit("/login/")
    assert logged_in(attempt("/login/", PASSWORD, address="10.0.0.2"))  # the operator, elsewhere
    assert logged_in(attempt("/login/", PASSWORD, username="colleague"))  # someone else, at the same address


def test_a_good_login_before_the_limit_forgets_the_failures(operator):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt("/login/", "wrong")
    assert logged_in(attempt("/login/", PASSWORD))
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt("/login/", "wrong")
    assert logged_in(attempt("/login/", PASSWORD))


def test_the_right_password_works_again_once_the_cool_off_has_passed(operator):
    fail_up_to_the_limit("/login/")
    assert attempt("/login/", PASSWORD).status_code == 429
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=15, seconds=1)
    )
    assert logged_in(attempt("/login/", PASSWORD))


def test_a_forced_login_as_the_tests_make_it_is_not_throttled(operator):
    """`client.force_login` (as the suite logs operators in) never reaches the throttle."""
    fail_up_to_the_limit("/login/")
    client = Client(REMOTE_ADDR="10.0.0.1")
    client.force_login(operator)
    assert client.get("/").status_code == 200
