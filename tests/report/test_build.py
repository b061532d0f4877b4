"""The builder against the wording the JAX backends write today: each event, built, is the
Finding the backend makes itself. These tests are the contract for moving the JAX backends
onto the event layer."""

import math

import numpy as np
import pytest

from gradsan._events import Certificate, Note, Origin, Poison, Verdict, ZeroKind
from gradsan._report import _build, _messages
from gradsan._report._records import Frame

jax = pytest.importorskip("jax")


# ---- certify ------------------------------------------------------------------------------------


def _loss(theta):
    return theta


def _ray(verdict, grad=None, fprime=None, limit=None, certificate="", notes=()):
    from gradsan.jax.certify._rays import RayResult

    g = None if grad is None else [np.asarray(grad, np.float64)]
    return RayResult(verdict, g, fprime, limit, certificate, list(notes))


CERT_CASES = {
    # name: (rays, directions, unverified, the event's verdict and slots)
    "gradient": (
        [_ray("DEFINED", [1.0, 2.0], 0.5), _ray("DEFINED", [1.0, 2.0], 0.7)],
        [[1.0, 0.0], [0.0, 1.0]],
        set(),
        dict(verdict=Verdict.GRADIENT, differentiable=True),
    ),
    "one-sided": (
        [_ray("DEFINED", [1.0, 2.0], 0.5), _ray("DOMAIN", certificate="leaves the domain")],
        [[1.0, 0.0], [0.0, 1.0]],
        {"erf_inv"},
        dict(verdict=Verdict.GRADIENT, differentiable=None, domain_rays=1),
    ),
    "removable": (
        [_ray("REMOVABLE", [1.0, 0.0], 0.0, 1.0), _ray("DEFINED", [1.0, 0.0], 0.0)],
        [[1.0, 0.0], [0.0, 1.0]],
        set(),
        dict(verdict=Verdict.GRADIENT, differentiable=True, removable=True),
    ),
    "two-limits": (
        [_ray("DEFINED", [1.0, 0.0], 1.0), _ray("DEFINED", [-1.0, 0.0], 1.0)],
        [[1.0, 0.0], [-1.0, 0.0]],
        set(),
        dict(verdict=Verdict.CLARKE_TWO_LIMITS, differentiable=False),
    ),
    "kink": (
        [_ray("DEFINED", [0.0, 0.0], 1.0), _ray("DEFINED", [0.0, 0.0], 1.0)],
        [[1.0, 0.0], [-1.0, 0.0]],
        set(),
        dict(verdict=Verdict.CLARKE_KINK, differentiable=False),
    ),
    "singular-inf-slope": (
        [_ray("SINGULAR", fprime=math.inf, certificate="t^0.5 term"), _ray("DEFINED", [1.0, 0.0])],
        [[1.0, 0.0], [0.0, 1.0]],
        set(),
        dict(
            verdict=Verdict.SINGULAR,
            differentiable=False,
            ray_verdict="SINGULAR",
            ray_certificate="t^0.5 term",
        ),
    ),
    "singular": (
        [_ray("SINGULAR", fprime=1.0, certificate="a pole")],
        [[1.0, 0.0]],
        set(),
        dict(verdict=Verdict.SINGULAR, ray_verdict="SINGULAR", ray_certificate="a pole"),
    ),
    "discontinuous": (
        [_ray("REMOVABLE", [1.0, 0.0], 0.0, 1.0), _ray("REMOVABLE", [1.0, 0.0], 0.0, 2.0)],
        [[1.0, 0.0], [0.0, 1.0]],
        set(),
        dict(
            verdict=Verdict.DISCONTINUOUS,
            differentiable=False,
            limits=(1.0, 2.0),
            directions=(0, 1),
        ),
    ),
    "undecided": (
        [_ray("UNDECIDED", notes=["horizon", "cap"]), _ray("DEFINED", [1.0, 0.0])],
        [[1.0, 0.0], [0.0, 1.0]],
        set(),
        dict(verdict=Verdict.UNDECIDED, ray_notes=("horizon", "cap")),
    ),
    "undecided-silent": (
        [_ray("UNDECIDED")],
        [[1.0, 0.0]],
        set(),
        dict(verdict=Verdict.UNDECIDED),
    ),
    "domain": (
        [_ray("DOMAIN", certificate="x < 0")],
        [[1.0, 0.0]],
        set(),
        dict(verdict=Verdict.DOMAIN, differentiable=False),
    ),
}


@pytest.mark.parametrize("case", sorted(CERT_CASES))
def test_certificate_event_builds_certifys_finding(case):
    from gradsan.jax.certify import _api as _certify

    rays, dirs, unverified, slots = CERT_CASES[case]
    x0s = [np.zeros(2)]
    treedef = jax.tree_util.tree_structure(0.0)
    ctx = _certify.Ctx()
    ctx.unverified = set(unverified)
    dirs = [[np.asarray(d)] for d in dirs]
    want = _certify._combine(_loss, "loss", treedef, x0s, dirs, rays, ctx, 1.0, 4)
    ev = Certificate(
        where=_certify._frame_of(_loss),
        output=_certify._arg_name(_loss),
        size=2,
        verdicts=[r.to_dict(i) for i, r in enumerate(rays)],
        fx0=1.0,
        terms=4,
        unverified=tuple(unverified),
        **slots,
    )
    got = _build.build(ev)
    assert got == want.findings[0]
    assert _build.certificate_notes(ev) == want.notes


# ---- nansafe ------------------------------------------------------------------------------------

WHERE = Frame("loss.py", 7, 11, "loss", "    y = jnp.where(x > 0, jnp.sqrt(x), 0.0)", 22)


def _site(kind, why=frozenset(), op="mul", primitive="sqrt", library=None):
    from gradsan.jax._nansafe import _Site

    return _Site(("k",), kind, op, primitive, WHERE, library, why)


def _jax_event(site, n, margins=None):
    from gradsan.jax._nansafe import _Emitter

    return _Emitter.event(site, n, margins or {})


_STRUCT = (
    "3 element(s) of `{op}` computed 0 * inf (or 0 / 0) with a structurally zero factor; "
    "set to exactly 0, the true gradient (G3)"
)


@pytest.mark.parametrize(
    "site, margins, want",
    [
        (
            dict(kind="struct", why=frozenset({("select", "m1")})),
            {"m1": 1.0},
            ("resolved", "sqrt-at-zero", "structural zero: unselected where branch, margin 1"),
        ),
        (
            dict(kind="struct", why=frozenset({("select", "m1")})),
            {"m1": float("inf")},
            ("resolved", "sqrt-at-zero", "structural zero: unselected where branch"),
        ),
        (
            dict(kind="struct", why=frozenset({"constant zero factor", ("select", "m")})),
            {},
            (
                "resolved",
                "sqrt-at-zero",
                "structural zero: constant zero factor; unselected where branch",
            ),
        ),
        (dict(kind="struct"), {}, ("resolved", "sqrt-at-zero", "structural zero: zero path")),
        (
            dict(kind="struct", op="div", library="jnp.linalg.norm"),
            {},
            ("resolved", "norm-at-zero", "structural zero: zero path"),
        ),
        (dict(kind="conv"), {}, ("resolved", "sqrt-at-zero", "strong-zero convention")),
        (
            dict(kind="unres", op="div"),
            {},
            ("unresolved", "sqrt-at-zero", "none: the zero is numerical"),
        ),
    ],
)
def test_nansafes_events_build_its_findings(site, margins, want):
    s = _site(**site)
    f = _build.build(_jax_event(s, 3, margins))
    assert (f.kind, f.catalog_id, f.detail["rule"]) == want
    assert f.primitive == "sqrt" and f.where == WHERE and f.count == 3
    if s.kind == "struct":
        assert f.values == _STRUCT.format(op=s.op) and f.detail["proven"] is True
    elif s.kind == "conv":
        assert f.values == (
            "3 element(s) of `mul` set to 0 by the strong-zero convention "
            "(not proven: can be a wrong finite value)"
        )
        assert f.detail["proven"] is False
    else:
        assert f.values == "3 element(s) of `div` computed 0 * inf (or 0 / 0) and stayed NaN"
        assert f.detail["count"] == 3


def test_merged_counts_are_written_once_not_patched_into_text():
    s = _site("struct", frozenset({("select", "m")}))
    events = _build.merged([_jax_event(s, 2), _jax_event(s, 1), _jax_event(_site("unres"), 4)])
    assert [e.count for e in events] == [3, 4]
    f = _build.build(events[0])
    assert f.values.startswith("3 element(s)") and f.detail["repaired"] == 3 and f.count == 3


# ---- explain ------------------------------------------------------------------------------------

# the poison of each gallery case, as jax/_explain reads it off the operands at the first NaN
POISONS = {
    "abs-vs-norm": ((0.0, math.inf), 0),
    "flux-normalise": ((-0.0, math.inf), 0),
    "pairwise-distance": ((-math.inf, 0.0), 1),
    "zygote-sqrt": ((0.0, math.inf), 0),
    "where-trap": ((0.0, 0.0), 0),
}
# what made each zero exact (Poison.zero_kind, and zero_value: the where's condition there)
ZEROS = {
    "abs-vs-norm": (ZeroKind.DERIVATIVE, ""),
    "flux-normalise": (ZeroKind.CANCEL, ""),
    "pairwise-distance": (ZeroKind.DERIVATIVE, ""),
    "zygote-sqrt": (ZeroKind.DERIVATIVE, ""),
    "where-trap": (ZeroKind.WHERE, "False"),
}


def _note(text):
    if text == _messages.NOTE_DERIVATIVE_RULE_NAN:
        return Note.DERIVATIVE_RULE_NAN, ""
    if text.startswith("its derivative is "):
        return Note.DERIVATIVE_IS, text.split()[3]
    return Note.RETURNED, text.rsplit(" ", 1)[1]


@pytest.mark.slow  # explain (with its fixes verified) on each of the 8 gallery cases: ~14 CPU-s
def test_origin_events_build_explains_findings():
    """Every finding of the demo gallery, rebuilt from the facts explain has at its origin."""
    import gradsan.jax as gsj
    from gradsan._demo import case as demo_cases

    for case in sorted(demo_cases.CASES):
        c = demo_cases.CASES[case]()
        (want,) = gsj.explain(c.grad)(*c.args).findings
        poison = None
        if want.form is not None:
            operands, zero = POISONS[case]
            zero_kind, zero_value = ZEROS[case]
            assert want.detail["zero_kind"] == zero_kind.value, case
            poison = Poison(
                op=want.met_op,
                where=want.met_where,
                form=want.form,
                backward=True,
                op_class="div" if want.form == "0/0" else "mul",
                operands=operands,
                zero_operand=zero,
                zero_from=want.zero_from,
                zero_kind=zero_kind,
                zero_value=zero_value,
            )
        note, value = _note(want.detail["note"])
        ev = Origin(
            backend="jax",
            op=want.primitive,
            where=want.where,
            phase=want.phase,
            result=want.result,
            entry_id=want.catalog_id,
            backend_op=want.backend_op.removesuffix(" (backward)"),
            backward=want.backend_op.endswith(" (backward)"),
            got=want.detail.get("got"),
            count=want.count,
            size=want.size,
            index=want.index,
            library=want.library,
            context=want.context,
            scope=want.scope,
            outputs=tuple(want.outputs),
            origin_op=want.detail["origin_op"],
            note=note,
            note_value=value,
            produced=want.detail.get("met_value", ""),
            poison=poison,
        )
        assert _build.build(ev) == want, case


def test_origin_of_a_nonfinite_input_jax_wording():
    ev = Origin(
        backend="jax",
        op="input",
        where=None,
        phase="value",
        result="nan",
        entry_id="nonfinite-input",
        count=1,
        size=3,
        index=(2,),
        input="x",
        held="nan",
    )
    f = _build.build(ev)
    assert f.values == "`x` holds nan in 1 of 3 elements, first at [2]"
    assert f.detail["input"] == "x" and f.kind == "nonfinite"


def test_origins_without_a_catalog_entry_are_explained_by_the_builder():
    base = dict(backend="jax", op="sub", where=None, phase="value", result="nan", origin_op="sub")
    f = _build.build(
        Origin(**base, poison=Poison("sub", None, "inf-inf", op_class="sum"), because=None)
    )
    assert f.zero_from is None and f.detail["met_text"] == "inf + (-inf) = nan in the `sub`"
    f = _build.build(Origin(**base, because=_build.Because.NOT_IN_CATALOG))
    assert f.explanation.startswith("`sub` produced nan from finite inputs.")
    p = Poison("sub", None, "inf-inf", op_class="sum")
    f = _build.build(Origin(**base, poison=None, because=_build.Because.CONSTANT_INFS))
    assert "computed a NaN from infinite inputs" in f.explanation
    f = _build.build(Origin(**{**base, "poison": p}, because=_build.Because.CONSTANT_INFS))
    assert "computed inf + (-inf) = nan from infinite inputs" in f.explanation
    f = _build.build(Origin(**base, because=_build.Because.SHARD_MAP, body_op="log"))
    assert f.primitive == "log" and f.library == "shard_map" and "`log`" in f.explanation


# ---- sanitize -----------------------------------------------------------------------------------


# the keys the builder writes from the entry and the event's numbers
BUILDER_KEYS = (
    "op",
    "convention",
    "subdifferential",
    "got",
    "derivative",
    "comparison",
    "trivial_count",
    "tie",
    "tie_note",
)


@pytest.mark.slow  # sanitize of six programs: ~8 CPU-s
def test_kink_events_build_sanitizes_findings():
    """sanitize's kinks, rebuilt from the facts it has at each one (JAX's value at the kink is
    the backend's fact; the entry's convention and subdifferential are the builder's words)."""
    import jax.numpy as jnp

    import gradsan.jax as gsj
    from gradsan._events import Kink

    programs = [
        (jax.grad(lambda x: jnp.sum(jnp.abs(x))), (jnp.array([1.0, 0.0]),)),
        (jax.grad(lambda x, y: jnp.maximum(x, y)), (1.0, 1.0)),
        (jax.grad(lambda x: jnp.floor(x) * x), (2.0,)),
        (jax.grad(lambda p: jnp.arctan2(p[0], p[1])), (jnp.zeros(2),)),
        (jax.grad(lambda x: jnp.where(x > 0, x, 2 * x)), (0.0,)),
        # a trivial tie, in a program that runs its own backward pass (issue 15: sanitize
        # checks a loss or jax.grad of it and leaves trivial ties out; here it labels them)
        (lambda x: jax.grad(lambda y: jnp.maximum(2 * y, y + y))(x), (1.5,)),
    ]
    seen = set()
    for fun, args in programs:
        for want in gsj.sanitize(fun)(*args).findings:
            if want.kind not in ("kink", "convention"):
                continue
            seen.add((want.catalog_id, want.detail.get("tie")))
            d = want.detail
            ev = Kink(
                backend="jax",
                entry_id=want.catalog_id,
                op=d["op"],
                primitive=want.primitive,
                where=want.where,
                backend_op=want.backend_op,
                got=d.get("got"),
                count=want.count,
                size=want.size,
                index=want.index,
                library=want.library,
                context=want.context,
                scope=want.scope,
                inadmissible_convention=want.kind == "convention",
                comparison=d["comparison"].split()[1] if "comparison" in d else None,
                trivial=d.get("trivial_count"),
                facts={k: v for k, v in d.items() if k not in BUILDER_KEYS},
            )
            assert _build.build(ev) == want, want.catalog_id
    assert {c for c, _ in seen} >= {
        "abs-at-zero",
        "max-tie",
        "atan2-at-origin",
        "where-at-boundary",
    }
    assert ("max-tie", "trivial") in seen and ("max-tie", "non-trivial") in seen
