"""docs/PROTOCOL.md's 50-line plugin is the tested example, verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_listing_in_protocol_md_is_examples_no_sdk_py():
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text()
    start = doc.index("```python\n#!/usr/bin/env python3\nimport json") + len("```python\n")
    listing = doc[start:doc.index("```", start)]
    source = (ROOT / "sdk" / "python" / "examples" / "no_sdk.py").read_text()
    docstring_end = source.index('"""', source.index('"""') + 3) + 4
    assert listing == source[:source.index("\n") + 1] + source[docstring_end:]
    assert len(listing.splitlines()) <= 50
