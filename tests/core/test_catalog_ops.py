"""The catalog's op classes and masks: consistent with the entries, agreeing across numpy, jax
and torch, and equal to the copies the backends still keep (so that each copy can become an
import of its catalog set)."""

from __future__ import annotations

import numpy as np
import pytest

from gradsan import _catalog
from gradsan._catalog import _masks, _ops
from gradsan._catalog._classify import classify, entry_ids, known_ops
from gradsan._catalog._types import CONVENTION_KINDS

NONFINITE_KINDS = {"singular", "pole", "domain", "overflow"}


# ---- the classes against the entries -------------------------------------------------------


def test_every_singular_entry_op_is_classed():
    ops = {e.op for e in _catalog.ENTRIES if e.kind in NONFINITE_KINDS}
    # atan2's derivative is 0 / 0 at the origin, an entry of kind discontinuity; where-trap
    # (op "where") is picked from the zero's kind, not classified by its op
    assert ops - _ops.LIBRARY - {"overflow", "where"} == _ops.SINGULAR - {"atan2"}


def test_every_kink_entry_op_is_classed():
    ops = {e.op for e in _catalog.ENTRIES if e.kind in CONVENTION_KINDS}
    assert ops - {"norm", "std"} <= _ops.KINKS


def test_every_class_member_with_an_entry_has_a_predicate():
    assert _ops.SINGULAR <= known_ops()
    assert _ops.KINKS <= known_ops()
    for op in _ops.SINGULAR | _ops.KINKS:
        ids = entry_ids(op)
        assert ids, op
        for entry_id in ids:
            _catalog.get(entry_id)


def test_classes_are_consistent():
    assert _ops.CONTINUOUS_KINKS.isdisjoint(_ops.JUMPS)
    assert _ops.EQUALITY_TIES <= _ops.CONTINUOUS_KINKS
    assert _ops.REDUCTION_TIES - {"select_and_scatter_add"} <= _ops.CONTINUOUS_KINKS
    assert _ops.AT_UNIT <= _ops.SINGULAR
    assert _ops.CAN_MAKE_NONFINITE.isdisjoint({"integer_pow"})
    assert _masks.kink_ops() <= _ops.KINKS


# ---- the backends' copies (each becomes an import of the set on the right) -----------------


def test_jax_nansafe_sets():
    nansafe = pytest.importorskip("gradsan.jax._nansafe")
    # nansafe reads the catalog's sets (no copy of its own)
    assert nansafe._SINGULAR is _ops.CAN_MAKE_NONFINITE
    assert nansafe._ZERO_TO_ZERO is _ops.ZERO_TO_ZERO


def test_jax_sanitize_sets():
    sanitize = pytest.importorskip("gradsan.jax._sanitize")
    rules = pytest.importorskip("gradsan.jax._rules")
    assert sanitize.TIES is _ops.TIES
    assert set(rules.COMPARISONS) == _ops.COMPARISONS
    # KINK_OPS maps lax names onto canonical ops: relu, hypot and the fused activations are
    # composites in lax, and where is reached through select_n
    assert set(rules.KINK_OPS.values()) == _ops.KINKS - {"relu", "activation", "hypot", "where"}
    for lax_name, op in rules.KINK_OPS.items():
        assert lax_name == op or (lax_name, op) in {
            ("convert_element_type", "trunc"),
            ("bessel_i0e", "i0e"),
        }


def test_jax_subgradient_sets():
    subgradient = pytest.importorskip("gradsan.jax._subgradient")
    assert subgradient.CONTINUOUS is _ops.CONTINUOUS_KINKS
    assert subgradient.JUMP_OPS is _ops.JUMPS


def test_jax_certify_sets():
    pytest.importorskip("gradsan.jax.certify")  # the rule modules add to the tables
    certify = pytest.importorskip("gradsan.jax.certify._point")
    assert certify._AT_ZERO == _ops.AT_ZERO
    assert certify._AT_ONE == _ops.AT_UNIT
    assert certify._TIES == _ops.EQUALITY_TIES | _ops.COMPARISONS
    assert certify.KINKY == _ops.REDUCTION_TIES | _ops.ROUNDINGS


def test_jax_rules_map_onto_catalog_ops():
    rules = pytest.importorskip("gradsan.jax._rules")
    for lax_name, op in rules.PRIMITIVE_OPS.items():
        assert lax_name == op and op in known_ops(), lax_name


def test_torch_kink_ops():
    rules = pytest.importorskip("gradsan.torch._rules")
    assert rules.KINK_OPS == {
        "abs", "relu", "max", "min", "reduce_max", "reduce_min", "argmax", "sort", "top_k",
        "clamp", "sign", "floor", "ceil", "round", "atan2", "select_n", "det", "activation",
    }  # fmt: skip
    assert set(rules.FUNC_OPS.values()) - {"select_n"} <= known_ops()


# ---- the masks: one set, any array module --------------------------------------------------

_X = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.0, 3.0, np.nan, np.inf, -np.inf, 1e-30]
_Y = [0.0, 1.0, 0.0, -1.0, 0.5, 2.0, 2.0, -3.0, 0.0, np.inf, 1.0, 0.0]

ELEMENTWISE = [
    _masks.at_zero,
    _masks.negative,
    _masks.at_minus_one,
    _masks.below_minus_one,
    _masks.abs_ge_one,
    _masks.le_one,
    _masks.nonpositive_integer,
    _masks.integer,
    _masks.half_integer,
    _masks.trunc_jump,
]
BINARY = [
    _masks.second_at_zero,
    _masks.origin,
    _masks.tie,
    _masks.xlogy_at_zero,
    _masks.xlogy_log_at_zero,
    _masks.xlogy_log_of_negative,
    _masks.pow_negative_base,
    _masks.pow_negative_at_zero,
    _masks.pow_fractional_at_zero,
    _masks.pow_exponent_grad_at_zero_base,
]


def _modules():
    out = [("numpy", np, np.asarray)]
    jnp = pytest.importorskip("jax.numpy")
    out.append(("jax", jnp, lambda v: jnp.asarray(v, jnp.float32)))
    torch = pytest.importorskip("torch")
    out.append(("torch", torch, lambda v: torch.tensor(v, dtype=torch.float32)))
    return out


@pytest.mark.parametrize("fn", ELEMENTWISE + BINARY, ids=lambda f: f.__name__)
def test_masks_agree_across_array_modules(fn):
    with np.errstate(invalid="ignore"):
        want = np.asarray(fn(np, [np.asarray(_X, np.float32), np.asarray(_Y, np.float32)], {}))
    for name, xp, arr in _modules():
        with np.errstate(invalid="ignore"):
            got = fn(xp, [arr(_X), arr(_Y)], {})
        got = got.numpy() if hasattr(got, "numpy") and name == "torch" else np.asarray(got)
        np.testing.assert_array_equal(got, want, err_msg=f"{fn.__name__} with {name}")


@pytest.mark.parametrize("op", ["reduce_max", "reduce_min", "clamp"])
def test_kink_masks_agree_across_array_modules(op):
    x = [[1.0, 3.0, 3.0], [2.0, 0.0, 0.0], [5.0, 4.0, 1.0]]
    for name, xp, arr in _modules():
        if op == "clamp":
            ops = [arr(0.0), arr(x), arr(3.0)]
            want = np.isin(np.asarray(x), [0.0, 3.0])
        else:
            ops = [arr(x)]
            want = np.array([[op == "reduce_max"], [op == "reduce_min"], [False]])
        got = _masks.kink_mask(op, ops, {"axes": (1,)}, xp=xp)
        got = got.numpy() if name == "torch" else np.asarray(got)
        np.testing.assert_array_equal(got, want, err_msg=f"{op} with {name}")


def test_predicates_read_the_masks():
    x = np.asarray(_X)
    for op, fn in [("sqrt", _masks.at_zero), ("log1p", _masks.at_minus_one)]:
        hit = classify(op, [x])
        np.testing.assert_array_equal(hit.mask, fn(np, [x], {}))
    hit = classify("floor", [x])
    np.testing.assert_array_equal(hit.mask, _masks.integer(np, [x], {}))


# ---- admissible sets -----------------------------------------------------------------------


def test_admissible_sets_belong_to_kink_entries():
    for e in _catalog.ENTRIES:
        if e.kind in CONVENTION_KINDS and e.id not in ("where-at-boundary", "std-of-constant"):
            assert e.admissible is not None, e.id
        if e.admissible is not None:
            assert e.kind in CONVENTION_KINDS, e.id
            # a set exists exactly where the catalog writes a subdifferential
            assert e.admissible.exists() == (e.subdifferential is not None), e.id


def test_admissible_contains_the_measured_conventions():
    adm = {e.id: e.admissible for e in _catalog.ENTRIES if e.admissible is not None}
    assert adm["abs-at-zero"].contains(1.0) and adm["abs-at-zero"].contains(0.0)  # JAX, torch
    assert not adm["abs-at-zero"].contains(1.5)
    assert adm["relu-at-zero"].contains(0.0) and not adm["relu-at-zero"].contains(-0.5)
    assert adm["max-tie"].contains([0.5, 0.5]) and not adm["max-tie"].contains([1.0, 1.0])
    assert adm["hypot-at-origin"].contains([0.5, 0.5])  # JAX
    assert not adm["hypot-at-origin"].contains([np.nan, np.nan])  # PyTorch
    assert not adm["norm-at-zero"].contains([np.nan, np.nan])  # JAX
    assert adm["eigh-repeated-eigenvalues"].contains([[0.5, 0.0], [0.0, 0.5]])
    assert not adm["eigh-repeated-eigenvalues"].contains([[1.0, 0.0], [0.0, 1.0]])
    assert not adm["sign-at-zero"].exists() and not adm["sign-at-zero"].contains(0.0)


# ---- torch's sanitize reads the catalog (no fallback masks of its own) ----------------------


def _torch_sanitize(fn, *xs):
    torch = pytest.importorskip("torch")
    gst = pytest.importorskip("gradsan.torch")
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
    return gst.sanitize(fn)(*ts)


def test_torch_one_sided_clamp_and_sort_ties_use_the_catalog_sets():
    torch = pytest.importorskip("torch")
    report = _torch_sanitize(lambda x: torch.clamp(x, min=0.0).sum(), [0.0, 1.0])
    [f] = report.findings
    assert (f.catalog_id, f.count, f.detail["got"]) == ("clip-at-bound", 1, "0.0")
    # only the tied elements, not every element of a tensor that has a tie somewhere
    report = _torch_sanitize(lambda x: torch.sort(x).values[-1], [3.0, 1.0, 3.0, 2.0])
    [f] = report.findings
    assert (f.catalog_id, f.count) == ("sort-tie", 2)
    # floor jumps at the integers, and inf is none (torch's own mask had it)
    report = _torch_sanitize(lambda x: torch.floor(x).sum(), [np.inf, 1.5, 2.0])
    [f] = [f for f in report.findings if f.kind == "kink"]
    assert (f.catalog_id, f.count, f.index) == ("floor-round-at-jump", 1, (2,))


def test_torch_conventions_outside_the_admissible_set():
    torch = pytest.importorskip("torch")
    report = _torch_sanitize(lambda a: torch.det(a), [[1.0, 2.0], [2.0, 4.0]])
    kinds = {f.catalog_id: f.kind for f in report.findings}
    assert kinds.get("det-at-singular") == "convention"
    assert _catalog.get("det-at-singular").inadmissible == ("torch",)
    report = _torch_sanitize(lambda x: torch.sign(x).sum(), [0.0])
    assert [(f.catalog_id, f.kind) for f in report.findings] == [("sign-at-zero", "kink")]
