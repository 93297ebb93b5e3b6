"""The seed's search query parsed and compiled (``gateway.search``) and the built-in ranking
policies (``gateway.ranking``): pure logic, no I/O."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.errors import InvalidArgument
from gateway.ranking import BUILT_IN, Candidate, Policies, RankingContext, UnknownPolicy
from gateway.search import like_regex, parse_query


def query(filter: dict[str, Any], **rule: Any) -> dict[str, Any]:
    values = {"executionMode": "code", "policyRuleURI": "random", **rule}
    values["parameters"] = {"filterRule": {"matchType": "block", "filter": filter}}
    return {"body": {"values": {"matchType": "cluster", "rankingPolicyRule": {"values": values}}}}


def test_the_seeds_query_compiles_to_filters() -> None:
    parsed = parse_query(
        query(
            {
                "clusterQuery": {"variable": "id", "operator": "==", "value": "cluster-123"},
                "blockQuery": {
                    "logicalOperator": "AND",
                    "conditions": [
                        {
                            "variable": "component.metadata.algorithmType",
                            "operator": "==",
                            "value": "llm",
                        },
                        {
                            "variable": "component.metadata.model",
                            "operator": "LIKE",
                            "value": "gpt",
                        },
                        {
                            "logicalOperator": "OR",
                            "conditions": [
                                {"variable": "size", "operator": ">=", "value": 7},
                                {"variable": "id", "operator": "IN", "value": ["blk-x"]},
                            ],
                        },
                    ],
                },
            }
        )
    )
    assert parsed.cluster_filter == {"inference_server_metadata.cluster_id": {"$eq": "cluster-123"}}
    assert parsed.block_filter == {
        "$and": [
            {"component.metadata.algorithmType": {"$eq": "llm"}},
            {"component.metadata.model": {"$regex": "gpt"}},
            {"$or": [{"size": {"$gte": 7}}, {"id": {"$in": ["blk-x"]}}]},
        ]
    }


def test_cluster_variables() -> None:
    def compiled(variable: str) -> dict[str, Any]:
        cond = {"variable": variable, "operator": "!=", "value": "x"}
        return parse_query(query({"clusterQuery": cond})).cluster_filter

    assert compiled("tags") == {"inference_server_tags": {"$ne": "x"}}
    assert compiled("region") == {"inference_server_metadata.region": {"$ne": "x"}}
    assert compiled("inference_server_name") == {"inference_server_name": {"$ne": "x"}}


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("gpt", ["gpt", "openai-gpt-4"], ["GPT", "g-p-t"]),
        ("gpt%", ["gpt-4"], ["openai-gpt"]),
        ("g_t", ["gpt", "a-got-4", "g-t"], ["gt", "gxxt"]),
        ("g_t%", ["gpt-4"], ["a-gpt"]),
        ("a.b%", ["a.bc"], ["axbc"]),
    ],
)
def test_like(pattern: str, matches: list[str], misses: list[str]) -> None:
    regex = re.compile(like_regex(pattern))
    assert all(regex.search(value) for value in matches)
    assert not any(regex.search(value) for value in misses)


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({}, "query_parameters.body"),
        ({"body": {"values": {"matchType": "galaxy"}}}, "query_parameters.body.values.matchType"),
        (query({}, executionMode="remote"), "rankingPolicyRule.values.executionMode"),
        (query({}, policyRuleURI=""), "rankingPolicyRule.values.policyRuleURI"),
        (
            query({"blockQuery": {"variable": "a", "operator": "~", "value": 1}}),
            "filter.blockQuery.operator",
        ),
        (
            query({"blockQuery": {"variable": "a", "operator": "IN", "value": 1}}),
            "filter.blockQuery.value",
        ),
        (
            query({"blockQuery": {"logicalOperator": "XOR", "conditions": []}}),
            "filter.blockQuery.logicalOperator",
        ),
        (
            query({"clusterQuery": {"logicalOperator": "OR", "conditions": [{"variable": ""}]}}),
            "filter.clusterQuery.conditions[0].variable",
        ),
    ],
)
def test_refusals_name_the_field(document: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_query(document)
    assert refused.value.field is not None and refused.value.field.endswith(field)


def test_a_query_keeps_its_digest_whatever_its_key_order() -> None:
    one = {"clusterQuery": {"variable": "id", "operator": "==", "value": "c"}}
    two = {"clusterQuery": {"value": "c", "operator": "==", "variable": "id"}}
    assert parse_query(query(one)).digest == parse_query(query(two)).digest
    assert parse_query(query(one)).digest != parse_query(query(one, policyRuleURI="sticky")).digest


def candidate(block: str, cluster: str = "c1", **fields: Any) -> Candidate:
    return Candidate(block, cluster, cluster == "c1", {}, **fields)


CONTEXT = RankingContext("sess-1")


def test_least_loaded_prefers_the_fewest_waiting_per_slot() -> None:
    ranked = BUILT_IN["least-loaded"]().rank(
        [candidate("a", load=2.0), candidate("b", load=0.5), candidate("r", "c2")], CONTEXT
    )
    assert [c.block_id for c in ranked] == ["b", "a", "r"]  # unknown load last


def test_lowest_latency_measured_first() -> None:
    ranked = BUILT_IN["lowest-latency"]().rank(
        [candidate("r", "c2", latency=0.2), candidate("q", "c3"), candidate("a", latency=0.0)],
        CONTEXT,
    )
    assert [c.block_id for c in ranked] == ["a", "r", "q"]


def test_sticky_keeps_a_session_on_one_block() -> None:
    blocks = [candidate(f"b{n}") for n in range(8)]
    sticky = BUILT_IN["sticky"]()
    first = sticky.rank(blocks, CONTEXT)[0]
    assert all(sticky.rank(list(reversed(blocks)), CONTEXT)[0] == first for _ in range(3))
    chosen = {sticky.rank(blocks, RankingContext(f"s{n}"))[0].block_id for n in range(50)}
    assert len(chosen) > 1  # sessions spread over the blocks


def test_random_ranks_every_candidate() -> None:
    blocks = [candidate(f"b{n}") for n in range(5)]
    assert sorted(BUILT_IN["random"]().rank(blocks, CONTEXT), key=lambda c: c.block_id) == blocks


def test_policies_by_uri() -> None:
    policies = Policies()
    assert policies.get("sticky:v2") is policies.get("sticky:v2")  # made once
    with pytest.raises(UnknownPolicy, match="policies.none"):
        policies.get("policies.none:v1")


def test_policies_made_per_name_not_per_uri() -> None:
    policies = Policies()
    made = {id(policies.get(f"random:{n}")) for n in range(1000)}
    assert len(made) == 1  # one policy, whatever versions the requests name
    assert len(policies._made) == 1


@pytest.mark.parametrize(
    "uri",
    ["random:" + "x" * 1_000_000, "random:a b", "Random", "a" * 65, ":v1", "random:v1:v2"],
)
def test_policy_uris_not_of_their_shape_are_refused_before_any_lookup(uri: str) -> None:
    policies = Policies()
    with pytest.raises(UnknownPolicy, match="not a policy URI") as refused:
        policies.get(uri)
    assert len(str(refused.value)) < 200  # a short prefix quoted, never the whole URI
    assert policies._made == {}
