"""Search (``query_parameters``): the block a task names by what it is, not by its id.

The seed's query::

    {"body": {"values": {
        "matchType": "cluster" | "block",
        "rankingPolicyRule": {"values": {
            "executionMode": "code",
            "policyRuleURI": "<a ranking policy>",
            "settings": {...},
            "parameters": {"filterRule": {
                "matchType": "cluster" | "block",
                "filter": {
                    "clusterQuery": <condition or group>,
                    "blockQuery": <condition or group>}}}}}}}}

A condition is ``{"variable", "operator", "value"}`` with the operators ``== != < <= > >= LIKE
IN``; a group is ``{"logicalOperator": "AND" | "OR", "conditions": [...]}`` (nested groups
allowed). ``clusterQuery`` reads the registry's servers (one per cluster's gateway): ``id`` is
the cluster id, ``name``, ``tags`` and ``url`` the record's, ``status`` its status, any other
variable a path into its metadata (``region``, ``gpu.type``). ``blockQuery`` reads the blocks
the clusters publish: ``id`` is the block id, any other variable a path into the block's
metadata (``component.metadata.algorithmType``). ``LIKE`` is SQL's (``%``, ``_``); a pattern
without ``%`` matches anywhere in the value (``"gpt"`` is ``"%gpt%"``).

Each query becomes a MongoDB filter (:mod:`blocks.mongo.filters`), and both run in one SQL
statement over the registry (:func:`blocks.inference_servers.search_blocks`), live servers only. Of
the blocks found, this cluster's count only if the account may use them, another cluster's
only if public; the ranking policy (:mod:`gateway.ranking`) orders them and the first is the
task's. The choice is kept for the session (``session_id → block_id, connection``) for
``route_ttl`` seconds. Nothing found is ``NOT_FOUND`` naming the query that matched nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from blocks.mongo.common import MongoError
from gateway.errors import InvalidArgument, NotFound
from gateway.ranking import Candidate, Policies, RankingContext, UnknownPolicy

ROOT = "query_parameters.body.values"
RULE = f"{ROOT}.rankingPolicyRule.values"
FILTER = f"{RULE}.parameters.filterRule.filter"
MATCH_TYPES = ("cluster", "block")
OPERATORS = {"==": "$eq", "!=": "$ne", "<": "$lt", "<=": "$lte", ">": "$gt", ">=": "$gte"}
CLUSTER_FIELDS = {
    "id": "inference_server_metadata.cluster_id",
    "name": "inference_server_name",
    "tags": "inference_server_tags",
    "url": "inference_server_public_url",
    "status": "status",
}


@dataclass(frozen=True, slots=True)
class Query:
    policy_uri: str
    settings: dict[str, Any]
    parameters: dict[str, Any]
    #: MongoDB filters over the registry's servers and over the published blocks.
    cluster_filter: dict[str, Any]
    block_filter: dict[str, Any]
    #: The query's canonical digest: what a session's choice is kept under.
    digest: str


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument("must be a JSON object", where)
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument("must be a non-empty string", where)
    return value


def parse_query(query_parameters: dict[str, Any]) -> Query:
    """The seed's query, checked: :class:`InvalidArgument` naming the first field at fault."""
    values = _object(
        _object(query_parameters.get("body"), "query_parameters.body").get("values"), ROOT
    )
    if values.get("matchType", "block") not in MATCH_TYPES:
        raise InvalidArgument("must be cluster or block", f"{ROOT}.matchType")
    rule = _object(
        _object(values.get("rankingPolicyRule"), f"{ROOT}.rankingPolicyRule").get("values"), RULE
    )
    if rule.get("executionMode", "code") != "code":
        raise InvalidArgument(
            "must be code (a ranking policy the gateway has, named by policyRuleURI)",
            f"{RULE}.executionMode",
        )
    uri = _text(rule.get("policyRuleURI"), f"{RULE}.policyRuleURI")
    settings = _object(rule.get("settings", {}), f"{RULE}.settings")
    parameters = _object(rule.get("parameters", {}), f"{RULE}.parameters")
    filter_rule = _object(parameters.get("filterRule", {}), f"{RULE}.parameters.filterRule")
    if filter_rule.get("matchType", "block") not in MATCH_TYPES:
        raise InvalidArgument("must be cluster or block", f"{RULE}.parameters.filterRule.matchType")
    filters = _object(filter_rule.get("filter", {}), FILTER)
    cluster = filters.get("clusterQuery")
    block = filters.get("blockQuery")
    canonical = json.dumps(query_parameters, sort_keys=True, separators=(",", ":"))
    return Query(
        policy_uri=uri,
        settings=settings,
        parameters=parameters,
        cluster_filter=_compile(cluster, f"{FILTER}.clusterQuery", _cluster_path)
        if cluster is not None
        else {},
        block_filter=_compile(block, f"{FILTER}.blockQuery", _block_path)
        if block is not None
        else {},
        digest=hashlib.sha256(canonical.encode()).hexdigest()[:32],
    )


def _cluster_path(variable: str) -> str:
    if variable in CLUSTER_FIELDS:
        return CLUSTER_FIELDS[variable]
    if variable.startswith("inference_server_"):
        return variable
    return f"inference_server_metadata.{variable}"


def _block_path(variable: str) -> str:
    return variable


def _compile(node: Any, where: str, path: Callable[[str], str]) -> dict[str, Any]:
    node = _object(node, where)
    if "conditions" in node or "logicalOperator" in node:
        operator = node.get("logicalOperator", "AND")
        if operator not in ("AND", "OR"):
            raise InvalidArgument("must be AND or OR", f"{where}.logicalOperator")
        conditions = node.get("conditions")
        if not isinstance(conditions, list) or not conditions:
            raise InvalidArgument("must be a non-empty list", f"{where}.conditions")
        parts = [
            _compile(item, f"{where}.conditions[{i}]", path) for i, item in enumerate(conditions)
        ]
        return {"$and" if operator == "AND" else "$or": parts}
    variable = _text(node.get("variable"), f"{where}.variable")
    operator = node.get("operator")
    value = node.get("value")
    field = path(variable)
    if operator in OPERATORS:
        return {field: {OPERATORS[operator]: value}}
    if operator == "IN":
        if not isinstance(value, list):
            raise InvalidArgument("IN takes a list", f"{where}.value")
        return {field: {"$in": value}}
    if operator == "LIKE":
        return {field: {"$regex": like_regex(_text(value, f"{where}.value"))}}
    raise InvalidArgument(
        f"unknown operator {operator!r} (one of {', '.join([*OPERATORS, 'LIKE', 'IN'])})",
        f"{where}.operator",
    )


def like_regex(pattern: str) -> str:
    """A SQL ``LIKE`` pattern as a regular expression; without ``%``, matched anywhere."""
    anywhere = "%" not in pattern
    parts = []
    for char in pattern:
        if char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    body = "".join(parts)
    return body if anywhere else f"^{body}$"


@dataclass(frozen=True, slots=True)
class Found:
    """A block a search may run a task on."""

    block_id: str
    cluster_id: str
    metadata: dict[str, Any]
    public: bool
    #: The address of the cluster's gateway.
    url: str


Searcher = Callable[[dict[str, Any], dict[str, Any]], Awaitable[list[Found]]]
Counter = Callable[[dict[str, Any]], Awaitable[int]]


class BlockSearch:
    """Runs a query: finds, keeps what the account may use, ranks, picks."""

    def __init__(
        self,
        cluster_id: str,
        search: Searcher,
        count_clusters: Counter,
        policies: Policies | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        self.search = search
        self.count_clusters = count_clusters
        self.policies = policies or Policies()

    async def choose(
        self,
        query: Query,
        session_id: str,
        usable: Callable[[Found], Awaitable[bool]],
        describe: Callable[[Found], Awaitable[Candidate]],
    ) -> Found:
        """The block the query's policy ranks first among those the account may use."""
        try:
            policy = self.policies.get(query.policy_uri)
        except UnknownPolicy as unknown:
            raise InvalidArgument(str(unknown), f"{RULE}.policyRuleURI") from None
        try:
            found = await self.search(query.cluster_filter, query.block_filter)
        except MongoError as error:  # a value of the wrong kind for its operator
            raise InvalidArgument(error.message, f"{FILTER}.{error.location}") from None
        found = [f for f in found if await usable(f)]
        if not found:
            if not await self.count_clusters(query.cluster_filter):
                raise NotFound("no live cluster matches the query", f"{FILTER}.clusterQuery")
            raise NotFound("no block matches the query", f"{FILTER}.blockQuery")
        candidates = {(c.cluster_id, c.block_id): c for c in [await describe(f) for f in found]}
        ranked = policy.rank(
            list(candidates.values()),
            RankingContext(session_id, query.settings, query.parameters),
        )
        if not ranked:
            raise NotFound(f"ranking policy {query.policy_uri} chose no block", "query_parameters")
        first = ranked[0]
        chosen = (first.cluster_id, first.block_id)
        return next(f for f in found if (f.cluster_id, f.block_id) == chosen)
