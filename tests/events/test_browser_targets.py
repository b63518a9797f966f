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
