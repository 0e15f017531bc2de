"""docs/kit-rules.md names every rule of the kits (s2core/kit/catalog.py), and every kit test
has a rule, so every kit failure can start with one."""

from pathlib import Path

from s2core.kit.catalog import ALL_RULES, rule_of_test
from s2core.kit.codec_conformance import CodecConformance
from s2core.kit.conformance import BackendConformance

PAGE = Path(__file__).parent.parent / "docs" / "kit-rules.md"


def test_the_page_lists_every_rule():
    text = PAGE.read_text()
    missing = [rule for rule in ALL_RULES if f"`{rule}`" not in text]
    assert not missing, missing


def test_every_kit_test_checks_a_named_rule():
    tests = [name for cls in (BackendConformance, CodecConformance) for name in dir(cls)
             if name.startswith("test_")]
    assert tests and not [t for t in tests if rule_of_test(t) is None]
