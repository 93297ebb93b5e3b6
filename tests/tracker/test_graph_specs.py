"""Named graphs' specs, checked without a database: the shape, the expressions and what they
read, the order and its cycles, and the mappings against the blocks' Cog schemas (blocks
resolved in memory, validators built as the catalog builds them). Every refusal names its
field."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from blocks.blocks import BlockInfo
from blocks.graphs.expressions import BadExpression, compile_expression, truthy
from blocks.graphs.specs import MAX_STEPS, RefusedGraph, checked_spec, parse_spec
from blocks.named_graphs import CompiledGraph, compile_graph, explain
from blocks.versions import BlockVersion
from catalog.records import VersionInfo
from tracker.input_checks import build_validator

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def _schema(input: dict[str, Any], output: Any, **enums: Any) -> dict[str, Any]:
    schemas = {"Input": {"title": "Input", "type": "object", **input}, **enums}
    if output is not None:
        schemas["Output"] = output
    return {"components": {"schemas": schemas}}


SCHEMAS = {
    # The echo model's: every input has a default; the output is a list of strings.
    "blk-echo0000": _schema(
        {
            "properties": {
                "prompt": {"type": "string", "default": "hello"},
                "n": {"type": "integer", "default": 1, "minimum": 1},
                "delay": {"type": "number", "default": 0.0},
                "fail": {"type": "boolean", "default": False},
            }
        },
        {"type": "array", "items": {"type": "string"}, "x-cog-array-type": "iterator"},
    ),
    "blk-caption0": _schema(
        {"properties": {"image": {"type": "string", "format": "uri"}}, "required": ["image"]},
        {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "score": {"type": "number"},
                "boxes": {"type": "array", "items": {}},
            },
        },
    ),
    "blk-transl00": _schema(
        {
            "properties": {
                "text": {"type": "string"},
                "lang": {"allOf": [{"$ref": "#/components/schemas/lang"}], "default": "fr"},
                "note": {"type": "string", "nullable": True, "default": None},
                "strength": {"type": "integer", "default": 1},
            },
            "required": ["text"],
        },
        {"type": "string"},
        lang={"title": "lang", "enum": ["fr", "de"], "type": "string"},
    ),
    # Says nothing of its output.
    "blk-opaque00": _schema({"properties": {"anything": {}}}, {}),
    # A version without a schema at all.
    "blk-noschema": {},
}


def _target(block_id: str) -> BlockVersion:
    schema = SCHEMAS[block_id]
    block = BlockInfo(block_id, 1, "owner", 1, "owner/dep", None, "owner/model", {}, False, NOW)
    version = VersionInfo(f"v-{block_id}", "owner/model", schema, None, 1, NOW, True)
    return BlockVersion(block, version, build_validator(schema))


async def _resolve(block_id: str) -> BlockVersion | None:
    # "blk-hidden00" stands for a block the account may not use: answered as unknown.
    return _target(block_id) if block_id in SCHEMAS else None


GOOD: dict[str, Any] = {
    "name": "caption-translate",
    "steps": [
        {
            "id": "caption",
            "block": "blk-caption0",
            "input": {"image": "input.image"},
            "timeout": 30,
        },
        {
            "id": "translate",
            "block": "blk-transl00",
            "input": {"text": "steps.caption.output.text", "lang": "'fr'"},
            "when": "input.translate",
            "after": [],
        },
        {"id": "shout", "block": "blk-echo0000", "input": {"prompt": "input.prompt"}},
    ],
    "output": "steps.translate.output",
    "return_steps": False,
}


async def _compile(spec: dict[str, Any]) -> CompiledGraph[BlockVersion]:
    return await compile_graph(spec, _resolve)


async def _refusals(spec: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(RefusedGraph) as refused:
        await _compile(spec)
    return [(e.field, e.message) for e in refused.value.errors]


def _with(**changes: Any) -> dict[str, Any]:
    """GOOD with each ``steps__<i>__<key>`` (or top-level ``key``) set; None removes it."""
    spec = copy.deepcopy(GOOD)
    for key, value in changes.items():
        where: dict[str, Any] = spec
        if key.startswith("steps__"):
            _, index, key = key.split("__")
            where = spec["steps"][int(index)]
        if value is None:
            where.pop(key, None)
        else:
            where[key] = value
    return spec


# -- what compiles ----------------------------------------------------------------------------


async def test_a_good_spec_compiles_with_its_order_and_dependencies() -> None:
    compiled = await _compile(GOOD)
    spec = compiled.spec
    assert spec.name == "caption-translate"
    assert spec.order == ("caption", "translate", "shout")
    assert [(s.id, s.needs) for s in spec.steps] == [
        ("caption", ()),
        ("translate", ("caption",)),
        ("shout", ()),
    ]
    assert spec.step("caption").timeout == 30.0
    assert compiled.blocks["translate"].block.id == "blk-transl00"


async def test_dependencies_come_from_input_when_and_after_in_the_graphs_order() -> None:
    spec = checked_spec(
        {
            "name": "deps",
            "steps": [
                {
                    "id": "last",
                    "block": "b",
                    "input": {"x": "{a: steps.first.output, b: steps.mid.output[0]}"},
                    "when": "steps.gate.output",
                    "after": ["other"],
                },
                {"id": "mid", "block": "b", "input": {"y": "steps.first.output.z"}},
                {"id": "first", "block": "b"},
                {"id": "gate", "block": "b", "input": {"q": "input.q"}},
                {"id": "other", "block": "b", "after": ["first"]},
            ],
        }
    )
    assert spec.order == ("first", "mid", "gate", "other", "last")
    assert spec.step("last").needs == ("first", "mid", "gate", "other")
    assert spec.step("mid").needs == ("first",)
    assert spec.step("other").needs == ("first",)
    assert spec.output is None  # the last listed step's output, when it runs


@pytest.mark.parametrize(
    ("text", "reads"),
    [
        ("steps.caption.output.text", ("caption",)),
        ("@.steps.a.output", ("a",)),
        ("steps.a.output[0]", ("a",)),
        ("steps.a[]", ("a",)),
        ("input.x && steps.c.output", ("c",)),
        ("not_null(steps.b.output, steps.a.output)", ("b", "a")),
        ("steps.a.output | length(@)", ("a",)),
        # Inside a filter, a projection or an &expression, ``steps`` is a field of each
        # element, not the context's.
        ("input.items[?name == steps.b.output].id", ()),
        ("input.items[*].steps.b", ()),
        ("sort_by(input.items, &steps.c)", ()),
        ("input.a.{k: steps.b}", ()),
        ("'fr'", ()),
    ],
)
def test_an_expression_reads_the_steps_it_names_from_the_context(
    text: str, reads: tuple[str, ...]
) -> None:
    assert compile_expression(text).reads == reads


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("steps.*.output", "without naming one"),
        ("steps[0]", "without naming one"),
        ("steps", "without naming one"),
        ("@", "whole context"),
        ("*", "whole context"),
        ('"fr"', "single quotes: 'fr'"),
        ("image", "does not hold"),
        ("shout(input)", "does not have"),
        ("length(input, input)", "takes 1"),
        ("steps.a.", "not valid JMESPath"),
        ("input.x ==", "not valid JMESPath"),
        ("", "not empty"),
        ("x" * 2000, "at most"),
    ],
)
def test_an_expression_that_cannot_be_followed_is_refused(text: str, said: str) -> None:
    with pytest.raises(BadExpression, match=said.replace("*", r"\*").replace("(", r"\(")):
        compile_expression(text)


def test_jmespath_truth() -> None:
    falsy: list[Any] = [None, False, "", [], {}]
    truthy_values: list[Any] = [True, 0, 0.0, "x", [0], {"a": None}]
    assert [truthy(v) for v in falsy] == [False] * len(falsy)
    assert [truthy(v) for v in truthy_values] == [True] * len(truthy_values)


# -- what each refusal names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "said"),
    [
        (_with(steps__1__input={"text": "steps.caption.output.", "lang": "'fr'"}),
         "steps[1].input.text", "not valid JMESPath"),
        (_with(steps__1__when="input.translate =="), "steps[1].when", "not valid JMESPath"),
        (_with(output="steps.*.output"), "output", "without naming one"),
        (_with(output="steps.nothing.output"), "output", "steps.nothing"),
        (_with(steps__1__input={"text": "steps.nope.output.text"}),
         "steps[1].input.text", "reads steps.nope, which is not a step"),
        (_with(steps__1__input={"text": "steps.translate.output"}),
         "steps[1].input.text", "cannot read its own output"),
        (_with(steps__1__when="steps.translate.output"), "steps[1].when", "its own output"),
        (_with(steps__1__after=["ghost"]), "steps[1].after[0]", "ghost is not a step"),
        (_with(steps__1__after=["translate"]), "steps[1].after[0]", "after itself"),
        (_with(steps__1__after="caption"), "steps[1].after", "list of step ids"),
        (_with(steps__2__id="caption"), "steps[2].id", "duplicate step id caption (steps[0])"),
        (_with(steps__2__id="2fast"), "steps[2].id", "not starting with a digit"),
        (_with(steps__2__id=None), "steps[2].id", "letters, digits"),
        (_with(steps__0__block="blk-zzzzzzzz"), "steps[0].block", "unknown block blk-zzzzzzzz"),
        (_with(steps__0__block=7), "steps[0].block", "must name a block"),
        (_with(steps__0__timeout=0), "steps[0].timeout", "above 0"),
        (_with(steps__0__timeout=True), "steps[0].timeout", "above 0"),
        (_with(steps__0__timeout=10**9), "steps[0].timeout", "at most"),
        (_with(steps__0__input=["input.image"]), "steps[0].input", "map each input field"),
        (_with(steps__0__inputs={}), "steps[0].inputs", "unknown field"),
        (_with(outputs="x"), "outputs", "unknown field"),
        (_with(name="no spaces allowed"), "name", "letters, digits"),
        (_with(name=None), "name", "letters, digits"),
        (_with(return_steps="yes"), "return_steps", "true or false"),
        (_with(steps=[]), "steps", "non-empty list"),
        (_with(steps=[3]), "steps[0]", "JSON object"),
    ],
)  # fmt: skip
async def test_each_fault_is_refused_naming_its_field(
    spec: dict[str, Any], field: str, said: str
) -> None:
    refusals = await _refusals(spec)
    assert any(f == field and said in message for f, message in refusals), refusals


async def test_an_unknown_and_an_invisible_block_are_refused_alike() -> None:
    unknown = await _refusals(_with(steps__2__block="blk-zzzzzzzz"))
    hidden = await _refusals(_with(steps__2__block="blk-hidden00"))
    assert [(f, m.replace("blk-zzzzzzzz", "<id>")) for f, m in unknown] == [
        (f, m.replace("blk-hidden00", "<id>")) for f, m in hidden
    ]


async def test_more_than_32_steps_are_refused_before_any_block_is_resolved() -> None:
    resolved: list[str] = []

    async def resolve(block_id: str) -> BlockVersion | None:
        resolved.append(block_id)
        return None

    steps = [{"id": f"s{i}", "block": "blk-echo0000"} for i in range(MAX_STEPS + 1)]
    with pytest.raises(RefusedGraph) as refused:
        await compile_graph({"name": "big", "steps": steps}, resolve)
    assert [e.field for e in refused.value.errors] == ["steps"]
    assert "33 steps; at most 32" in refused.value.errors[0].message
    assert resolved == []
    steps.pop()
    assert len(checked_spec({"name": "big", "steps": steps}).order) == MAX_STEPS


async def test_a_cycle_is_named_step_by_step_at_the_field_that_closes_it() -> None:
    spec = {
        "name": "loop",
        "steps": [
            {"id": "a", "block": "blk-echo0000", "input": {"prompt": "steps.c.output[0]"}},
            {"id": "b", "block": "blk-echo0000", "after": ["a"]},
            {"id": "c", "block": "blk-echo0000", "when": "steps.b.output"},
            {"id": "d", "block": "blk-echo0000"},
        ],
    }
    assert await _refusals(spec) == [
        ("steps[1].after[0]", "cycle a -> c -> b -> a (each step needs the next)")
    ]
    _, errors = parse_spec({**spec, "steps": spec["steps"][:1]})
    assert [e.field for e in errors] == ["steps[0].input.prompt"]  # c is gone: unknown


async def test_every_fault_is_listed_in_one_answer_in_the_specs_order() -> None:
    spec = _with(
        name="bad name",
        steps__0__block="blk-nothere0",
        steps__1__input={"text": "steps.caption.output.", "color": "'red'"},
        steps__2__when="@",
        output="steps.ghost.output",
    )
    assert [f for f, _ in await _refusals(spec)] == [
        "name",
        "steps[0].block",
        "steps[1].input.text",
        "steps[1].input.color",
        "steps[1].input.text",  # required: the bad expression left it unmapped
        "steps[2].when",
        "output",
    ]


# -- the mappings against the blocks' schemas -------------------------------------------------


def _one(block: str, input: dict[str, str], source_block: str = "blk-caption0") -> dict[str, Any]:
    return {
        "name": "pair",
        "steps": [
            {"id": "src", "block": source_block, "input": {"image": "input.image"}}
            if source_block == "blk-caption0"
            else {"id": "src", "block": source_block},
            {"id": "dst", "block": block, "input": input},
        ],
    }


@pytest.mark.parametrize(
    ("spec", "field", "said"),
    [
        # Cog would drop a field its Input does not declare, silently.
        (_one("blk-transl00", {"text": "input.t", "colour": "'red'"}),
         "steps[1].input.colour", "takes no input 'colour' (it takes: lang, note, strength, text)"),
        (_one("blk-transl00", {"lang": "'fr'"}), "steps[1].input.text", "requires text"),
        (_one("blk-transl00", {"text": "input.t", "lang": "'es'"}),
         "steps[1].input.lang", "'es' is not one of ['fr', 'de']"),
        (_one("blk-transl00", {"text": "input.t", "strength": "'high'"}),
         "steps[1].input.strength", "is not of type 'integer'"),
        (_one("blk-transl00", {"text": "`3`"}), "steps[1].input.text", "not of type 'string'"),
        # The KServe lesson: an output that cannot fit the input it is mapped to.
        (_one("blk-transl00", {"text": "steps.src.output"}, "blk-echo0000"),
         "steps[1].input.text",
         "steps.src.output is an array (block blk-echo0000's Output schema), but text takes a "
         "string"),
        (_one("blk-transl00", {"text": "steps.src.output.boxes"}),
         "steps[1].input.text", "is an array"),
        (_one("blk-transl00", {"text": "steps.src.output.score"}),
         "steps[1].input.text", "is a number"),
        (_one("blk-transl00", {"text": "steps.src.output"}), "steps[1].input.text", "an object"),
        (_one("blk-transl00", {"text": "steps.src.output.text.more"}),
         "steps[1].input.text", "always null"),
        (_one("blk-echo0000", {"n": "steps.src.output.text"}),
         "steps[1].input.n", "is a string (block blk-caption0's Output schema), but n takes an "
         "integer"),
        (_one("blk-echo0000", {"fail": "steps.src.output.score"}),
         "steps[1].input.fail", "but fail takes a boolean"),
    ],
)  # fmt: skip
async def test_a_mapping_the_blocks_schemas_refuse_names_the_field(
    spec: dict[str, Any], field: str, said: str
) -> None:
    refusals = await _refusals(spec)
    assert any(f == field and said in message for f, message in refusals), refusals


@pytest.mark.parametrize(
    ("block", "input", "source"),
    [
        ("blk-transl00", {"text": "steps.src.output.text"}, "blk-caption0"),
        ("blk-transl00", {"text": "steps.src.output.text", "note": "steps.src.output.text"},
         "blk-caption0"),
        # Only definite faults: an integer into a number and back, a computed value, an
        # output or a field the schema does not describe, a block without a schema.
        ("blk-echo0000", {"delay": "steps.src.output.score"}, "blk-caption0"),
        ("blk-echo0000", {"n": "steps.src.output.score"}, "blk-caption0"),
        ("blk-transl00", {"text": "join(' ', steps.src.output)"}, "blk-echo0000"),
        ("blk-transl00", {"text": "steps.src.output[0]"}, "blk-echo0000"),
        ("blk-transl00", {"text": "steps.src.output.unknown"}, "blk-caption0"),
        ("blk-transl00", {"text": "steps.src.output"}, "blk-opaque00"),
        ("blk-transl00", {"text": "steps.src.output"}, "blk-noschema"),
        ("blk-noschema", {"whatever": "steps.src.output.boxes", "x": "`1`"}, "blk-caption0"),
        ("blk-opaque00", {"anything": "steps.src.output.boxes"}, "blk-caption0"),
        ("blk-transl00", {"text": "input.t", "lang": "'de'", "note": "`null`"}, "blk-caption0"),
    ],
)  # fmt: skip
async def test_a_mapping_that_may_fit_is_accepted(
    block: str, input: dict[str, str], source: str
) -> None:
    await _compile(_one(block, input, source))


async def test_explain_lists_the_resolved_plan_in_order() -> None:
    compiled = await _compile(_with(output=None))
    plan = explain(compiled, lambda target: target.block.id != "blk-echo0000")
    assert plan["name"] == "caption-translate"
    assert plan["output"] == "steps.shout.output"
    assert plan["return_steps"] is False
    assert [s["id"] for s in plan["steps"]] == ["caption", "translate", "shout"]
    assert plan["steps"][1] == {
        "id": "translate",
        "block": "blk-transl00",
        "model": "owner/model",
        "deployment": "owner/dep",
        "version": "v-blk-transl00",
        "synchronous": False,
        "served": True,
        "needs": ["caption"],
        "input": {"text": "steps.caption.output.text", "lang": "'fr'"},
        "when": "input.translate",
        "timeout": None,
    }
    assert plan["steps"][0]["timeout"] == 30.0 and plan["steps"][2]["served"] is False
    assert explain(compiled)["steps"][0]["served"] is None


async def test_a_lookup_that_fails_fails_the_compile_with_its_own_error() -> None:
    class Down(Exception):
        pass

    async def resolve(block_id: str) -> BlockVersion | None:
        if block_id == "blk-transl00":
            raise Down("the database is away")
        return await _resolve(block_id)

    with pytest.raises(Down):
        await compile_graph(GOOD, resolve)
