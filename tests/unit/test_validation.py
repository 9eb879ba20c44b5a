"""One verdict, worded once: `pdmtp validate`, the webhook's refusal and the ConfigCompatible
condition say the same words for the same object."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import pdd
from pdmtp.api import reasons
from pdmtp.cli import main
from pdmtp.core.context import Observed
from pdmtp.core.reconcile import decide
from pdmtp.core.validation import field_path, validate

NOW = 1_800_000_000.0


def broken_replicas() -> dict[str, Any]:
    obj = pdd("x").dict()
    obj["spec"]["decode"]["replicas"] = -2
    return obj


def test_a_compatible_spec_has_no_problems() -> None:
    verdict = validate(pdd("x").mtp(3, modules=3).dict())
    assert verdict.compatible and verdict.problems == ()
    assert verdict.agreement is not None and verdict.agreement.decode_lookahead == 3


def test_an_incompatible_spec_names_the_rule() -> None:
    verdict = validate(pdd("x").mtp(3).prefill(k=2).dict())
    assert verdict.usable and not verdict.compatible
    (problem,) = verdict.problems
    assert problem.reason == reasons.MTP_MODULES_UNKNOWN
    assert problem.line().startswith("MTPModulesUnknown: spec.prefill numSpeculativeTokens (2)")


def test_an_unparsable_spec_names_the_field_and_the_value() -> None:
    verdict = validate(broken_replicas())
    assert not verdict.usable
    (problem,) = verdict.problems
    assert problem.reason == reasons.INVALID_SPEC
    assert (
        problem.message
        == "spec.decode.replicas: Input should be greater than or equal to 1 (got -2)"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (pdd("x").mtp(3).prefill(k=2).dict(), reasons.MTP_MODULES_UNKNOWN),
        (broken_replicas(), reasons.INVALID_SPEC),
    ],
)
def test_cli_webhook_and_status_say_the_same_words(
    body: dict[str, Any], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (problem,) = validate(body).problems
    # The status condition.
    body = {**body, "metadata": {**body["metadata"], "namespace": "ns", "generation": 1}}
    conditions = decide(Observed(body), NOW).status["conditions"]
    compatible = next(c for c in conditions if c["type"] == reasons.CONFIG_COMPATIBLE)
    assert (compatible["reason"], compatible["message"]) == (reason, problem.message)
    # The CLI prints the same message.
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(body))
    main(["validate", str(path)])
    assert problem.message in capsys.readouterr().out
    # The webhook refuses with `<reason>: <message>` lines (controller.admit joins them).
    assert problem.line() == f"{reason}: {problem.message}"


def test_field_paths_read_like_the_yaml() -> None:
    assert field_path(("spec", "prefill", "env", 0, "name")) == "spec.prefill.env[0].name"
    assert field_path(("spec", "function-after[check()]", "image")) == "spec.image"
    assert field_path(()) == "(document)"


@pytest.mark.parametrize("status", [-1, "x", [], {"phase": 3}, None])
def test_validate_ignores_status_as_the_api_server_does(status: Any, tmp_path: Path) -> None:
    """The status subresource owns .status: the API server drops it from a create or update
    (tests/cluster/test_validate_differential.py found `status: -1` created), so `pdmtp validate`
    neither refuses nor judges it."""
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump({**pdd("x").mtp(3).dict(), "status": status}))
    assert main(["validate", str(path)]) == 0
