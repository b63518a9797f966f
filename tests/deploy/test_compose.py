"""docker-compose.yml checked without Docker (issue 30, item 1): strict YAML, the Compose
Specification's schema after compose's interpolation, every ledger service's environment
as valid ``Settings`` whose Kafka principal holds the ACLs its commands need, and every
command a real ``ledger`` command. No broker: pure parsing, well under a second."""

from __future__ import annotations

import copy
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml.constructor import DuplicateKeyError

from config.settings import Settings
from ledger.acls import SUPER_USER_COMMANDS, Acl, command_roles, role_acls
from ledger.cli import app
from tests.deploy.compose_file import (
    COMPOSE,
    ROOT,
    Unset,
    environment,
    interpolate,
    ledger_commands,
    load,
    parse_ledger,
    schema,
    substitute,
)

# What a user exports before `docker compose up` (README, Deploying): example values.
EXPORTED = {
    "KAFKA_ADMIN_PASSWORD": "admin-secret-1",
    "KAFKA_AGENT_PASSWORD": "agent-secret-1",
    "KAFKA_WORKER_PASSWORD": "worker-secret-1",
    "KAFKA_PROJECTOR_PASSWORD": "projector-secret-1",
    "KAFKA_READER_PASSWORD": "reader-secret-1",
    "LEDGER_CHANNELS__WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "LEDGER_DASHBOARD__TOKEN": "q8Yt3vNw0bX4kLm7Pz2Rc6Hs9Jd1Fg5Ue",
}
IMAGE = "delivery-ledger"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    done = interpolate(raw, EXPORTED)
    assert isinstance(done, dict)
    return done


THEIRS = {"kafka": "apache/kafka:4.1.1", "postgres": "postgres:16"}


def ours(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the project's code (all but Kafka's and PostgreSQL's)."""
    return {name: spec for name, spec in compose["services"].items() if name not in THEIRS}


# -- the loader and the interpolation ---------------------------------------------------


def test_a_duplicate_key_is_refused_beside_a_merge_too() -> None:
    load("a: &a {x: 1}\nb:\n  <<: *a\n  x: 2\n")  # a merge's key overridden: allowed
    doubled = "a: &a {x: 1}\nb:\n  <<: *a\n  environment: {y: 1}\n  environment: {y: 2}\n"
    with pytest.raises(DuplicateKeyError):
        load(doubled)
    with pytest.raises(DuplicateKeyError):
        load("b:\n  x: 1\n  x: 2\n")


def test_interpolation_as_compose_does_it() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert substitute("$SET ${SET} $$SET $$$SET", env) == "v v $SET $v"
    assert substitute("${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d}", env) == "d d  d"
    assert substitute("${SET:+r} ${EMPTY:+r} ${EMPTY+r} ${UNSET+r}", env) == "r  r "
    assert substitute("${UNSET:-${SET}x} ${EMPTY?ok}", env) == "vx "
    with pytest.raises(Unset, match="EMPTY: say why"):
        substitute("${EMPTY:?say why}", env)
    with pytest.raises(Unset, match="UNSET: set UNSET"):
        substitute("x ${UNSET?set ${SET:+UNSET}}", env)


# -- the file ---------------------------------------------------------------------------


def test_the_file_refuses_to_start_without_each_secret(raw: dict[str, Any]) -> None:
    """Every variable README's Deploying section tells the user to export is required
    (compose stops before starting anything), and nothing else is."""
    missing = []
    for name in EXPORTED:
        with pytest.raises(Unset) as refused:
            interpolate(raw, {k: v for k, v in EXPORTED.items() if k != name})
        missing.append(str(refused.value).split(":")[0])
    assert missing == list(EXPORTED)
    deploying = (ROOT / "README.md").read_text().split("## Deploying", 1)[1].split("\n## ")[0]
    assert [name for name in EXPORTED if name not in deploying] == []


def spec_errors(document: dict[str, Any]) -> list[str]:
    """What the Compose schema finds wrong, under the draft the schema names (compose-go's
    is 2020-12: an unknown service key is an unevaluated property)."""
    loaded = schema()
    validator_class = jsonschema.validators.validator_for(loaded)
    validator = validator_class(loaded, format_checker=validator_class.FORMAT_CHECKER)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def test_the_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    assert spec_errors(compose) == []


def test_the_schema_check_refuses_what_compose_refuses(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["restart_policy"] = "always"
    broken["services"]["worker"]["restart"] = 5
    errors = spec_errors(broken)
    assert any("'restart_policy' was unexpected" in e for e in errors), errors
    assert "services/worker/restart: 5 is not of type 'string'" in errors, errors


def test_the_services_run_the_image_not_a_checkout(compose: dict[str, Any]) -> None:
    services = compose["services"]
    ledger = ours(compose)
    assert set(ledger) == {"keys", "certs", "topics", "worker", "projector", "dashboard"}
    assert {name: services[name]["image"] for name in THEIRS} == THEIRS
    for name, spec in ledger.items():
        assert spec["image"] == IMAGE, name
        assert spec.get("build") in (".", {"context": "."}), name
        mounted = [
            v.split(":")[0] if isinstance(v, str) else v["source"] for v in spec.get("volumes", [])
        ]
        assert [m for m in mounted if m.startswith((".", "/"))] == [], f"{name} mounts the host"
        assert "user" not in spec, f"{name}: the image's own user (non-root)"


def test_every_long_running_service_restarts_and_has_a_healthcheck(
    compose: dict[str, Any],
) -> None:
    """Issue 24, item 2: long-running services come back by themselves."""
    services = compose["services"]
    one_shot = {
        name
        for spec in services.values()
        for name, condition in (spec.get("depends_on") or {}).items()
        if condition.get("condition") == "service_completed_successfully"
    }
    long_running = set(services) - one_shot
    assert long_running == {"kafka", "postgres", "worker", "projector", "dashboard"}
    for name in sorted(long_running):
        assert services[name].get("restart") in {"on-failure", "unless-stopped", "always"}, name
        assert services[name].get("healthcheck", {}).get("test"), name


def invocations(spec: dict[str, Any]) -> Iterator[list[str]]:
    """The ledger argument lists a service runs: its command, then its healthcheck's."""
    yield from ledger_commands(spec["command"])
    test = spec.get("healthcheck", {}).get("test")
    if isinstance(test, list) and test[:2] == ["CMD", "ledger"]:
        yield test[2:]
    elif isinstance(test, list) and test[:1] == ["CMD-SHELL"] and test[1].startswith("ledger "):
        words = shlex.split(test[1])
        yield words[1 : words.index(">/dev/null") if ">/dev/null" in words else None]


def test_every_command_is_a_ledger_command(compose: dict[str, Any]) -> None:
    for name, spec in ours(compose).items():
        for args in invocations(spec):
            path, _ = parse_ledger(args)  # raises the CLI's own usage error
            assert path, name


def service_settings(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """``Settings`` as the service's process reads them. Files the settings name must lie
    on one of the service's volumes; they are made (empty) under ``tmp`` instead."""
    env = environment(spec)
    targets = [v.split(":")[1] for v in spec.get("volumes", []) if isinstance(v, str)]
    for key, value in env.items():
        if key.endswith("FILE") and value.startswith("/"):
            assert any(value.startswith(t + "/") for t in targets), f"{key}={value}: on no volume"
            placed = tmp / value.lstrip("/")
            placed.parent.mkdir(parents=True, exist_ok=True)
            placed.touch()
            env[key] = str(placed)
    for key in [k for k in os.environ if k.startswith("LEDGER_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


def test_each_service_has_valid_settings_and_the_acls_its_commands_need(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = ours(compose)
    kafka = environment(compose["services"]["kafka"])
    jaas = kafka["KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG"]
    users = {
        word.split("=")[0].removeprefix("user_"): word.split("=")[1].strip('";')
        for word in jaas.split()
        if word.startswith("user_")
    }
    super_users = set(kafka["KAFKA_SUPER_USERS"].split(";"))
    granted: dict[str, set[Acl]] = {}
    needed: dict[str, set[Acl]] = {}
    for name, spec in sorted(services.items()):
        with monkeypatch.context() as patch:
            settings = service_settings(spec, tmp_path / name, patch)
        kafka_user = settings.kafka.sasl_username
        if kafka_user:
            password = settings.kafka.sasl_password
            assert password is not None
            assert users.get(kafka_user) == password.get_secret_value(), f"{name}: {kafka_user}"
        if name == "dashboard":
            from projections.dashboard import check_binding

            check_binding(settings.dashboard)  # refuses 0.0.0.0 without a sound token
        for args in invocations(spec):
            path, parsed = parse_ledger(args)
            principal = f"User:{kafka_user}"
            if path in SUPER_USER_COMMANDS:
                assert principal in super_users, f"{name}: ledger {path} needs a super user"
            if path == "acls grant":
                role, user = parsed.params["role"], parsed.params["user"]
                who = user if user.startswith("User:") else f"User:{user}"
                granted.setdefault(who, set()).update(role_acls(settings, role, who))
            for role in command_roles(path, settings):
                assert kafka_user, f"{name}: ledger {path} connects as no one"
                needed.setdefault(principal, set()).update(role_acls(settings, role, principal))
    assert needed, "no service needs an ACL: the check checked nothing"
    for principal, acls in sorted(needed.items()):
        lacking = sorted(acl.describe() for acl in acls - granted.get(principal, set()))
        assert lacking == [], f"{principal} lacks ACLs its commands need"


def test_the_certs_step_makes_what_the_broker_reads(tmp_path: Path) -> None:
    """``ledger broker certs`` (the certs service): the CA and the broker's keystore, kept
    when run again (a restarted stack keeps its certificates)."""
    certs = tmp_path / "certs"
    args = ["broker", "certs", str(certs), "--host", "kafka"]
    assert app(args, prog_name="ledger", standalone_mode=False) is None
    ca, keystore = (certs / "ca.pem").read_bytes(), certs / "broker-keystore.pem"
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----")
    assert keystore.stat().st_mode & 0o777 == 0o600
    app(args, prog_name="ledger", standalone_mode=False)
    assert (certs / "ca.pem").read_bytes() == ca
