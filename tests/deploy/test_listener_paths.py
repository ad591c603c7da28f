"""What the load balancer lets through to Triton: the stack's listener rules, matched as an ALB matches them.

An ALB evaluates a listener's rules by priority, lowest first; a path-pattern value is case-sensitive, ``*``
matches any run of characters (none included, ``/`` included) and ``?`` one character (Elastic Load Balancing's
"Condition types for listener rules"). Requests matching none of our rules fall to the listener's other rules or
its default, never to our target group. The module's rules are the stack's (tests/deploy/test_terraform.py), so
this holds for both.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.test_stack import Stack, mk
from tests.deploy.test_stack import template as template

FORWARDED = [
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/add",  # metadata
    "/v2/models/add/versions/1",
    "/v2/models/add/ready",
    "/v2/models/add/versions/1/ready",
    "/v2/models/add/infer",
    "/v2/models/add/versions/1/infer",
    "/v2/models/llm/generate",
    "/v2/models/llm/generate_stream",
    "/v2/models/config_model/infer",  # a name with "config" in it is not a configuration path
    "/v2/models/stats_model/infer",
]
REFUSED = [  # answered 403 by our deny rule
    "/v2/models/add/config",
    "/v2/models/add/versions/1/config",
    "/v2/models/stats",
    "/v2/models/add/stats",
    "/v2/models/add/versions/1/stats",
    "/v2/models/add/trace/setting",
]
NOT_OURS = [  # no rule of ours: the listener's default answers
    "/v2/repository/index",
    "/v2/repository/models/add/load",
    "/v2/repository/models/add/unload",
    "/v2/trace/setting",
    "/v2/logging",
    "/v2/systemsharedmemory/status",
    "/v2/systemsharedmemory/region/r/register",
    "/v2/cudasharedmemory/status",
    "/v2",  # server metadata
    "/metrics",
    "/V2/repository/index",  # case-sensitive: not Triton's path either
]


def _pattern(value: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in value), re.DOTALL)


def alb_route(rules: list[dict[str, Any]], path: str, host: str = "triton.example.com") -> str | None:
    """The action type of the first rule (by priority) whose every condition matches, or None."""
    for rule in sorted(rules, key=lambda r: int(r["Priority"])):
        matched = True
        for cond in rule["Conditions"]:
            if cond["Field"] == "path-pattern":
                values = cond["PathPatternConfig"]["Values"]
                matched &= any(_pattern(v).fullmatch(path) for v in values)
            elif cond["Field"] == "host-header":
                matched &= any(_pattern(v.lower()).fullmatch(host) for v in cond["HostHeaderConfig"]["Values"])
            else:
                raise AssertionError(f"a condition this test does not model: {cond['Field']}")
        if matched:
            (action,) = rule["Actions"]
            return str(action["Type"])
    return None


def rules_of(stack: Stack) -> list[dict[str, Any]]:
    return [stack.props(name) for name in stack.resources("AWS::ElasticLoadBalancingV2::ListenerRule")]


@pytest.mark.parametrize("params", [{}, {"ListenerHostHeader": "triton.example.com"}], ids=["any-host", "host"])
def test_only_inference_metadata_readiness_and_health_reach_triton(template: dict[str, Any], params: dict) -> None:
    rules = rules_of(mk(template, **params))
    assert [alb_route(rules, p) for p in FORWARDED] == ["forward"] * len(FORWARDED)
    assert {p: alb_route(rules, p) for p in REFUSED} == dict.fromkeys(REFUSED, "fixed-response")
    assert {p: alb_route(rules, p) for p in NOT_OURS} == dict.fromkeys(NOT_OURS)


def test_the_deny_rule_is_evaluated_first_and_answers_403(template: dict[str, Any]) -> None:
    stack = mk(template)
    deny, forward = stack.props("ListenerDenyRule"), stack.props("ListenerRule")
    assert int(deny["Priority"]) < int(forward["Priority"])
    (action,) = deny["Actions"]
    assert action["FixedResponseConfig"]["StatusCode"] == "403"
    # ALB's limits: at most three values a condition, five a rule (the host header counts).
    for rule in (deny, forward):
        counts = [len(c[key]["Values"]) for c in rule["Conditions"] for key in c if key.endswith("Config")]
        assert max(counts) <= 3 and sum(counts) <= 5, counts


def test_with_the_old_rule_the_repository_api_was_forwarded(template: dict[str, Any]) -> None:
    """The check above can fail: with the rule as it was (/v2/*), the load API was forwarded."""
    old = [dict(mk(template).props("ListenerRule"), Conditions=[
        {"Field": "path-pattern", "PathPatternConfig": {"Values": ["/v2/*"]}}
    ])]  # fmt: skip
    assert alb_route(old, "/v2/repository/models/add/load") == "forward"
