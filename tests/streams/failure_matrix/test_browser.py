"""The failure-matrix rows of the browser channel alone, against the fake form.

Real broker, real ``ledger worker`` processes driving Debian's Chromium, the fake form,
which does NOT dedupe. The rows the browser shares with the other channels (a crash or a
slow page after the submit, a rejection, a worker killed before or after the submit) are
in ``test_table.py``; these two need settings of their own.
"""

from __future__ import annotations

from events.delivery_state import Status
from events.retry_policy import RetryPolicy
from tests.fixtures.broker import ReadTopic
from tests.streams.failure_matrix.drivers import BROWSER_DEADLINE_S, BrowserDriver
from tests.streams.failure_matrix.stacks import Stack, StackPool


async def browser_stack(pool: StackPool, name: str, read_topic: ReadTopic) -> Stack[BrowserDriver]:
    return await pool.get(name, BrowserDriver, read_topic, shared=False)


async def test_browser_login_page_submits_nothing_and_fails_after_its_attempts(
    stack_pool: StackPool, read_topic: ReadTopic
) -> None:
    stack = await browser_stack(stack_pool, "browser-login", read_topic)
    # Two quick attempts: a login page is "nothing submitted", so each is retried.
    quick = RetryPolicy(base_delay_s=0.5, max_attempts=2)
    stack.configure(
        {"channels.retry_policies": {**stack.settings.channels.retry_policies, "browser": quick}}
    )
    stack.driver.app.login_required(True)  # the form redirects to its login page
    [key] = await stack.publish("run-b6")
    stack.workers.start("w1")
    states = await stack.until([key], {Status.FAILED}, "FAILED at the login")
    state = states[key]
    assert state.last_error_class == "login_page"
    assert state.attempt >= 2  # a first attempt refused by the lease rule adds one
    assert "/login" in (state.last_reason or "")
    assert "(screenshot " in (state.last_reason or "")
    assert (stack.driver.app.posts, stack.driver.app.accepted()) == (0, [])
    await stack.matches()


async def test_browser_submit_slower_than_the_global_deadline_is_confirmed_under_its_own(
    stack_pool: StackPool, read_topic: ReadTopic
) -> None:
    # The global deadline (1.5 s) would time the submit out after the write (UNKNOWN, then
    # a lookup); the browser's own deadline (LEDGER_CHANNELS__SEND_DEADLINES) lets the page answer.
    stack = await browser_stack(stack_pool, "browser-deadline", read_topic)
    stack.configure(
        {
            "channels.send_deadline_s": 1.5,
            "channels.http_timeout_s": 1.0,
            "channels.send_deadlines": {"browser": 3 * BROWSER_DEADLINE_S},
            # Slack beyond deadline + margin for a Chromium launch on a loaded machine:
            # with 4.5 s the lease rule once refused the send (attempt 2, correctly).
            "worker.lease_s": 3 * BROWSER_DEADLINE_S + 15,
        }
    )
    [key] = await stack.publish("run-b7")
    stack.driver.app.fault("slow", key=key, delay_s=3.0)  # accepted, answered 3 s later
    stack.workers.start("w1")
    states = await stack.until([key], {Status.CONFIRMED}, "CONFIRMED")
    state = states[key]
    assert state.attempt == 1
    assert state.last_error_class is None, state.last_reason  # confirmed by the page itself
    assert state.provider_message_id == stack.driver.accepted_once(key)
    assert len(stack.driver.sends(key)) == 1
    await stack.matches()
