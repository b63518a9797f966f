"""The browser channel's login-page check: is the page a target's login page, not its form?

A target declares how its login page looks (``login: {selector, url}``). Seen before the
submit (after the start URL's redirects, and again right before the click), the attempt
ends NOT_SENT with the class ``login_page``: nothing is submitted into a login form.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from events.channels.browser_targets import LoginRule

if TYPE_CHECKING:
    from playwright.async_api import Page


class LoginPage(Exception):
    """The page is the target's login page: nothing was submitted."""


async def check_not_login(page: Page, rule: LoginRule | None) -> None:
    """Raise ``LoginPage`` (saying what matched) when the page is the declared login page;
    only a positive match counts (a page that cannot be queried is left to the caller)."""
    if rule is None:
        return
    if rule.url is not None and re.search(rule.url, page.url):
        raise LoginPage(f"the page is the login page: its URL {page.url} matches {rule.url}")
    if rule.selector is None:
        return
    try:
        shown = await page.query_selector(rule.selector) is not None
    except Exception:  # noqa: BLE001 - a page navigating or gone: not seen, the caller goes on
        return
    if shown:
        raise LoginPage(f"the page is the login page: it shows {rule.selector} ({page.url})")
