"""The registration list: every family module exists, names itself, and answers every target."""

from onnxscript.rewriter import pattern

from deployfuse.rewrite import TARGETS, family_names
from deployfuse.rewrite.rules import FAMILY_MODULES, families


def test_every_family_answers_every_target():
    assert family_names() == [m.FAMILY for m in families()]
    assert len(set(family_names())) == len(FAMILY_MODULES)
    for module in families():
        for target in TARGETS:
            rules = module.rules(target)
            assert all(isinstance(r, pattern.RewriteRule) and r.name for r in rules), module.FAMILY
