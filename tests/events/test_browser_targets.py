"""Browser targets declared as data: a file or the settings, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from events.channels.browser_targets import BrowserSettings
from tests.fixtures.form import form_target


def search_lookup(base: str, search: dict[str, object] | None = None) -> dict[str, object]:
    """A valid search lookup of the fake form at ``base``, with ``search``'s changes."""
    lookup = form_target(base, lookup="search")["lookup"]
    return {"search": {**lookup["search"], **(search or {})}}


def test_targets_from_a_yaml_file_and_inline(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump({"targets": {"tickets": form_target("http://127.0.0.1:9")}}))
    inline = {"portal": form_target("http://127.0.0.1:8")}
    settings = BrowserSettings.model_validate({"targets_file": str(path), "targets": inline})
    assert sorted(settings.targets) == ["portal", "tickets"]
    assert settings.targets["tickets"].confirmation.attribute == "data-id"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": {"input": "#k", "param": "k"}}, "give exactly one of input"),
        ({"submit": ""}, "targets.t.submit: String should have at least 1 character"),
        ({"lookup": {"url": "http://127.0.0.1:9/accepted"}}, "lookup url must contain {key}"),
        ({"steps": [{"fill": "#t"}]}, "targets.t.steps.0"),
        (
            {"lookup": {"url": "http://127.0.0.1:9/a?key={key}", **search_lookup("http://h.test")}},
            "lookup needs exactly one of url (a list of accepted keys) or search",
        ),
        ({"lookup": {"list_field": "items"}}, "lookup needs exactly one of url"),
        (
            {"lookup": {**search_lookup("http://h.test"), "id_field": "n"}},
            "lookup id_field belong to a url lookup, not search",
        ),
        (
            {"lookup": search_lookup("http://h.test", search={"url": "http://h.test/search"})},
            "search url must contain {key}, or give fill and submit selectors",
        ),
        (
            {"lookup": search_lookup("http://h.test", search={"fill": "#q"})},
            "search url with {key} is the results page: leave out fill and submit",
        ),
        (
            {"lookup": search_lookup("http://h.test", search={"not_found": {}})},
            "not_found needs a selector, a text, or both",
        ),
        (
            {"lookup": search_lookup("http://h.test", search={"not_found": None})},
            "targets.t.lookup.search.not_found",
        ),
        ({"lookup": search_lookup("http://h.test", search={"result": ""})}, "result: String"),
        (
            {"lookup": search_lookup("http://h.test", search={"url": "ftp://h.test/{key}"})},
            "lookup.search",
        ),
        ({"login": {}}, "login needs a selector, a url (a regular expression), or both"),
        ({"login": {"url": "(unclosed"}}, "login url is not a regular expression"),
        ({"login": {"selector": "#login", "text": "Sign in"}}, "targets.t.login.text"),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_field(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"targets": {"t": {**form_target("http://127.0.0.1:9"), **change}}}))
    with pytest.raises(ValidationError) as caught:
        BrowserSettings.model_validate({"targets_file": str(path)})
    text = caught.value.errors(include_input=False)[0]["msg"]
    assert message in text
    assert "\n" not in text


def test_a_missing_file_and_a_bad_name() -> None:
    with pytest.raises(ValidationError, match=r"targets_file /nope\.json"):
        BrowserSettings.model_validate({"targets_file": "/nope.json"})
    with pytest.raises(ValidationError, match="target name 'Bad Name'"):
        BrowserSettings.model_validate({"targets": {"Bad Name": form_target("http://h.test")}})


def test_the_readme_declaration_validates() -> None:
    yaml = pytest.importorskip("yaml")
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## The browser channel", 1)[1]
    block = section.split("```yaml", 1)[1].split("```", 1)[0]
    settings = BrowserSettings.model_validate(yaml.safe_load(block))
    tickets = settings.targets["tickets"]
    assert tickets.key.input == "#idempotency-key"
    assert tickets.lookup is not None
    assert tickets.lookup.url is not None
    assert tickets.login is not None
    by_search = settings.targets["tickets-by-search"].lookup
    assert by_search is not None
    assert by_search.search is not None
    assert by_search.search.key_attribute == "data-key"


def test_ledger_channels_lists_browser() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "channels", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = {c["name"]: c for c in map(json.loads, done.stdout.splitlines())}
    browser = listed["browser"]
    assert (browser["lookup"], browser["first_answer"], browser["dedupe_rule"]) == (
        "by_key",
        "confirmed",
        None,
    )
    assert {"targets", "targets_file", "concurrency"} <= {s["name"] for s in browser["settings"]}
