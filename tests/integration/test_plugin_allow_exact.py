"""`--gradsan-allow` names exactly the tests it says: ``test_optimization10`` (the name the
failure text suggests for absl's 11th parameterized case) is not also ``test_optimization100``
to ``109``; a node id matches whole or by its tail at a ``/`` or ``::`` boundary; keyword
expressions work as ``-k``'s, numbers matched whole."""

import pytest

from gradsan._plugin_extras import Allow

pytest_plugins = ["pytester"]

SOURCE = """
import pytest

def test_optimization1(): pass
def test_optimization10(): pass
def test_optimization100(): pass
def test_optimization105(): pass

@pytest.mark.parametrize("n", [1, 2])
def test_optimization10_grad(n): pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n): pass

def test_apply_if_finite_sgd(): pass

class TestAlias:
    def test_optimization10(self): pass
    def test_optimization101(self): pass

class TestAliasMore:
    def test_optimization10(self): pass
"""


@pytest.fixture
def items(pytester):
    got = pytester.getitems(SOURCE)
    return {it.nodeid.partition("::")[2]: it for it in got}


def allowed(items, *values):
    allow = Allow(list(values))
    return sorted(k for k, it in items.items() if allow.matches(it))


def test_a_numbered_name_is_that_test_only(items):
    assert allowed(items, "test_optimization10") == [
        "TestAlias::test_optimization10",
        "TestAliasMore::test_optimization10",
        "test_optimization10",
        "test_optimization10_grad[1]",  # -k's substring: a word ending in a letter follows
        "test_optimization10_grad[2]",
    ]
    assert allowed(items, "test_optimization1") == ["test_optimization1"]


def test_keyword_expressions_still_match_parts_of_names(items):
    assert allowed(items, "apply_if_finite or test_param") == [
        "test_apply_if_finite_sgd",
        "test_param[1]",
        "test_param[2]",
    ]
    assert allowed(items, "TestAlias and not test_optimization10") == [
        "TestAlias::test_optimization101"
    ]
    assert allowed(items, "test_optimization and not grad") == [
        "TestAlias::test_optimization10",
        "TestAlias::test_optimization101",
        "TestAliasMore::test_optimization10",
        "test_optimization1",
        "test_optimization10",
        "test_optimization100",
        "test_optimization105",
    ]


def test_the_values_that_matched_no_test_are_known(items):
    allow = Allow(["test_optimization10", "f.py::nothing", "test_optimization2 or TestAlias"])
    for it in items.values():
        allow.matches(it)
    assert allow.unused() == ["f.py::nothing"]


def test_a_node_id_matches_whole_or_by_its_tail(items):
    assert allowed(items, "TestAlias::test_optimization10") == ["TestAlias::test_optimization10"]
    assert allowed(items, "TestAlias") == [
        "TestAlias::test_optimization10",
        "TestAlias::test_optimization101",
        "TestAliasMore::test_optimization10",  # a keyword: -k's part of a name
    ]
    name = next(iter(items.values())).nodeid.partition("::")[0]
    assert allowed(items, f"{name}::TestAlias") == [
        "TestAlias::test_optimization10",
        "TestAlias::test_optimization101",
    ]
    assert allowed(items, f"{name}::test_param") == ["test_param[1]", "test_param[2]"]
    assert allowed(items, f"{name}::test_param[2]") == ["test_param[2]"]
    assert allowed(items, f"x{name}::test_param") == []  # not a path boundary
    assert allowed(items, f"{name}::test_optimization10") == ["test_optimization10"]


@pytest.mark.slow  # one pytest in a subprocess, as a user runs it
def test_the_suggested_allow_allows_the_failing_test_only(pytester):
    pytester.makepyfile(
        test_opt="""
import jax, jax.numpy as jnp

def bad():
    jax.grad(lambda x: jnp.sqrt(jnp.sum(x ** 2)))(jnp.zeros(2))

def test_optimization10():
    bad()

def test_optimization100():
    bad()
"""
    )
    r = pytester.runpytest_subprocess(
        "--gradsan",
        "-p",
        "no:cacheprovider",
        "-rf",
        "--gradsan-allow=test_optimization10",
        "--gradsan-allow=test_optimization1",  # matches no test: said at the end
    )
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["*--gradsan-allow 'test_optimization1' matched none of the tests run."])
    r.stdout.fnmatch_lines(["FAILED test_opt.py::test_optimization100 - gradsan:*"])
    r.stdout.fnmatch_lines(['*--gradsan-allow="test_optimization100" (a -k expression*'])
