"""The dataclasses against schema/sharedos-protocol-v1.schema.json: every
wire field of a typed class exists in the schema with the same required
flag, and the class covers every field of its schema definition."""

import json
from pathlib import Path

import pytest

from sharedos_plugin.types import ERROR_CODES, PROTOCOL_VERSION, TYPED

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "schema" /
                     "sharedos-protocol-v1.schema.json").read_text())


def definition(name):
    base, _, variant = name.partition("/")
    d = SCHEMA["$defs"][base]
    if not variant:
        return d
    for option in d["oneOf"]:
        if option["properties"]["type"].get("const") == variant:
            return option
    raise KeyError(name)


@pytest.mark.parametrize("cls", TYPED, ids=lambda c: c.__name__)
def test_fields_match_the_schema(cls):
    d = definition(cls.SCHEMA_DEF)
    if "oneOf" in d:  # ToolResult: the union of its variants
        props = {k for o in d["oneOf"] for k in o["properties"]}
        required = set.intersection(*(set(o["required"]) for o in d["oneOf"]))
    else:
        props, required = set(d["properties"]), set(d["required"])
    wire = {name: req for _, name, req in cls.WIRE}
    assert set(wire) == props, f"{cls.__name__}: fields differ from the schema"
    assert {n for n, r in wire.items() if r} == required, f"{cls.__name__}: required differs"


def test_error_codes_match_the_schema():
    assert {e["kind"]: e["code"] for e in SCHEMA["errors"]} == ERROR_CODES


def test_protocol_version_is_offered():
    assert PROTOCOL_VERSION in SCHEMA["protocolVersions"]
