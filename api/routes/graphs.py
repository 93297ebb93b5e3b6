"""Named graphs: ``POST /v1/graphs`` registers a graph of blocks with field mappings, ``when``
conditions and per-step timeouts (:mod:`blocks.named_graphs`), which the inference gateway
runs by id; list, get, delete, and ``POST /v1/graphs/{id}/explain``, a dry run.

Registration checks the spec whole and answers every fault at once (422, each naming its
field, e.g. ``steps[1].input.text``), the blocks' schemas included: a step's output that
cannot fit the input it is mapped to is refused here, not when a request runs. A graph is its
account's alone; another account's answers 404, exactly as one that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api import serving
from api.deps import AccountDep, Resources, ResourcesDep
from api.errors import Conflict, InvalidInput, NotFound, invalid_input
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from blocks import named_graphs
from blocks.named_graphs import CompiledGraph, GraphNameTaken, RefusedGraph, StoredGraph
from blocks.versions import BlockVersion, find_block_version, served_now
from catalog.records import AccountInfo
from tracker.input_checks import RefusedInput, canonical_input
from tracker.keyset import PageKey

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


class GraphCreate(BaseModel):
    """Body of ``POST /v1/graphs``: the graph's spec. Every field is checked by the graph's
    own rules (not here), so that one answer names every fault."""

    model_config = ConfigDict(extra="allow")

    name: Any = Field(None, description="Unique among the account's graphs.")
    steps: Any = Field(
        None,
        description="Up to 32 steps: {id, block, input: {field: JMESPath}, when?, timeout?, "
        "after?}. Each expression reads the context {input: <task data>, steps: {<id>: "
        "{output}}}; a step waits for the steps it reads and those in after.",
    )
    output: Any = Field(None, description="JMESPath of the answer; default: the last step's.")
    return_steps: Any = Field(None, description="Answer {output, steps: {id: output}}.")


class GraphUrls(BaseModel):
    get: str
    explain: str


class Graph(BaseModel):
    id: str
    name: str
    spec: dict[str, Any]
    created_at: datetime
    urls: GraphUrls


class GraphPage(BaseModel):
    next: str | None = Field(description="URL of the next (older) page.")
    previous: str | None = Field(description="URL of the previous (newer) page.")
    results: list[Graph]


class ExplainedStep(BaseModel):
    id: str
    block: str
    model: str
    deployment: str | None
    version: str
    synchronous: bool
    served: bool | None = Field(
        description="A ready runner serves the block now (null: not known here)."
    )
    needs: list[str] = Field(description="The steps it waits for.")
    input: dict[str, str]
    when: str | None
    timeout: float | None


class GraphPlan(BaseModel):
    id: str
    name: str
    steps: list[ExplainedStep] = Field(description="In an order where each follows its needs.")
    output: str
    return_steps: bool


NAME_TAKEN = {
    **problems(409)[409],
    "description": "The account has a graph of that name already.",
}


def render_graph(graph: StoredGraph, base_url: str) -> dict[str, Any]:
    url = f"{base_url}/v1/graphs/{graph.id}"
    return {**named_graphs.render(graph), "urls": {"get": url, "explain": f"{url}/explain"}}


async def _compiled(
    resources: Resources, account: AccountInfo, spec: Any
) -> CompiledGraph[BlockVersion]:
    """The spec checked against the blocks as ``account`` sees them; 422 naming each fault."""
    try:
        return await named_graphs.compile_graph(
            spec, lambda block_id: find_block_version(resources.catalog, account, block_id)
        )
    except RefusedGraph as refused:
        errors = [{"field": e.field, "message": e.message} for e in refused.errors]
        raise InvalidInput(refused.detail, errors=errors) from None


@router.post(
    "/graphs",
    status_code=201,
    response_model=Graph,
    responses={**problems(400, 401, 413, 422, 503), 409: NAME_TAKEN},
    openapi_extra=operation(),
)
async def create_graph(
    request: Request, body: GraphCreate, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    """Register a graph of blocks under a name, its mappings checked against the blocks'
    schemas."""
    spec = body.model_dump(exclude_unset=True)
    try:
        canonical_input(spec, root="spec")  # what Postgres and every response can hold
    except RefusedInput as refused:
        raise invalid_input(refused) from None
    compiled = await _compiled(resources, account, spec)
    try:
        graph = await named_graphs.create(resources.engine, account.id, compiled.spec.name, spec)
    except GraphNameTaken:
        message = f"the account has a graph named {compiled.spec.name} already"
        raise Conflict(f"name: {message}", errors=[{"field": "name", "message": message}]) from None
    rendered = render_graph(graph, resources.base_url(request))
    return FastJSONResponse(
        rendered, status_code=201, headers={"Location": rendered["urls"]["get"]}
    )


@router.get(
    "/graphs",
    response_model=GraphPage,
    responses=problems(400, 401, 503),
    openapi_extra=operation(),
)
async def list_graphs(
    request: Request, account: AccountDep, resources: ResourcesDep, cursor: str | None = None
) -> FastJSONResponse:
    """The caller's graphs, newest first, a page at a time."""
    base_url = resources.base_url(request)
    limit = resources.settings.page_size
    after, before = serving.read_cursor(cursor)
    rows = await named_graphs.list_graphs(
        resources.engine, account.id, after=after, before=before, limit=limit + 1
    )
    page, next_url, previous_url = serving.keyset_page(
        rows,
        after,
        before,
        limit,
        f"{base_url}/v1/graphs?cursor=",
        lambda graph: PageKey(graph.created_at, graph.id),
    )
    results = [render_graph(graph, base_url) for graph in page]
    return FastJSONResponse({"next": next_url, "previous": previous_url, "results": results})


async def _graph(resources: Resources, account: AccountInfo, graph_id: str) -> StoredGraph:
    graph = await named_graphs.get(resources.engine, account.id, graph_id)
    if graph is None:
        raise NotFound(f"Graph {graph_id} not found")
    return graph


@router.get(
    "/graphs/{graph_id}",
    response_model=Graph,
    responses=problems(401, 404, 503),
    openapi_extra=operation(),
)
async def get_graph(
    request: Request, graph_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    graph = await _graph(resources, account, graph_id)
    return FastJSONResponse(render_graph(graph, resources.base_url(request)))


@router.delete(
    "/graphs/{graph_id}",
    status_code=204,
    responses=problems(401, 404, 503),
    openapi_extra=operation(),
)
async def delete_graph(graph_id: str, account: AccountDep, resources: ResourcesDep) -> Response:
    """Delete one of the caller's graphs."""
    if await named_graphs.delete_graph(resources.engine, account.id, graph_id):
        return Response(status_code=204)
    raise NotFound(f"Graph {graph_id} not found")


@router.post(
    "/graphs/{graph_id}/explain",
    response_model=GraphPlan,
    responses=problems(401, 404, 422, 503),
    openapi_extra=operation(),
)
async def explain_graph(
    graph_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    """A dry run: the plan the graph resolves to now (blocks and their versions as the caller
    sees them, checked again) and whether a ready runner serves each step; nothing runs. A
    graph that would be refused now answers 422 naming each fault."""
    graph = await _graph(resources, account, graph_id)
    compiled = await _compiled(resources, account, graph.spec)
    return FastJSONResponse({"id": graph.id, **named_graphs.explain(compiled, _served(resources))})


def _served(resources: Resources) -> Callable[[BlockVersion], bool | None] | None:
    """Whether a ready runner serves a step's block, by this replica's view of the fleet (the
    synchronous lane's); None where this replica has none."""
    if resources.lane is None:
        return None
    fleet = resources.lane.fleet
    return lambda target: served_now(fleet, target.block, target.version)
