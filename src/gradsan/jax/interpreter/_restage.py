"""Higher-order rules that re-emit control flow with the sidecar carried (the *restage* strategy).

An evaluating transformation runs the taken branch of a ``cond`` and a loop iteration by
iteration (``_unroll.py``). A transformation that *emits* a program (nansafe, sanitize's
compiled screen) cannot: under ``jax.jit`` the branch index and the trip count are traced. It
re-emits the primitive instead (``lax.switch``, ``lax.scan``, ``lax.while_loop``, ``jax.jit``,
``jax.checkpoint``) around a body that runs the interpreter, and carries the sidecar through it.

A sidecar has a static part (its *signature*: hashable, what the body is traced for) and a
dynamic part (its *leaves*: traced arrays, such as masks). The interpreter subclass says how to
split and rebuild one (:class:`Restaging`). A loop's carry is traced for the join of its
signatures over iterations: a fixpoint, reached by tracing the body abstractly
(``jax.eval_shape``) until the signature of what it returns adds nothing to what it was given.

Accumulators (counts, minima) that a body adds to (:meth:`Restaging.accumulate`) are threaded
out as extra outputs, through the loop's carry for ``scan`` and ``while``, and added to the
enclosing body's. Keys are kept in the order they were first added (never sorted).

``RESTAGE`` holds the rules for ``cond``, ``scan`` and ``while``. Call-likes are inlined by the
core's ``call`` hook; a transformation whose compiled units must stay those of the program (a
nested ``jax.jit``; ``jax.checkpoint`` with its policy) calls :func:`call_jit` or
:func:`call_remat` from its ``call`` override.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat
from ._core import Interpreter, Rule, Scope

_MAX_FIXPOINT = 6  # the signature lattices in use are finite and shallow


class Restaging(Interpreter):
    """An interpreter whose higher-order primitives are re-emitted (rules from ``RESTAGE``).

    The defaults describe a sidecar with no dynamic part whose signature is the sidecar
    itself (hashable, joined only when equal): override the ``side_*`` methods for more.
    ``acc`` is the accumulator of the body being traced: key -> traced array; the subclass
    adds to it with :meth:`accumulate` and reads (and resets) it around a top-level run.
    """

    acc: dict[Hashable, Any]

    def __init__(self) -> None:
        super().__init__()
        self.acc = {}

    # -- the sidecar -----------------------------------------------------------------------------
    def side_sig(self, side: Any) -> Any:
        """The static part of ``side``: what a body is traced for."""
        return side

    def side_leaves(self, side: Any, value: Any, sig: Any) -> list:
        """The traced arrays that signature ``sig`` carries for ``side`` (of ``value``); ``sig``
        may be wider than ``side_sig(side)`` (a static part then becomes an array)."""
        return []

    def side_build(self, sig: Any, leaves: Iterator) -> Any:
        """The sidecar of signature ``sig``, consuming its leaves from ``leaves``."""
        return sig

    def side_join(self, a: Any, b: Any) -> Any:
        """The least signature that covers both (a loop's carry, a cond's outputs)."""
        if a != b:
            raise TypeError(f"{type(self).__name__}: override side_join to join {a!r} and {b!r}")
        return a

    # -- accumulators ------------------------------------------------------------------------------
    def acc_init(self, key: Any, aval: Any) -> Any:
        """The identity of ``acc_combine`` for ``key``, of ``aval``'s shape and dtype."""
        return jnp.zeros(aval.shape, aval.dtype)

    def acc_combine(self, key: Any, old: Any, new: Any) -> Any:
        return old + new

    def accumulate(self, key: Any, value: Any) -> None:
        prev = self.acc.get(key)
        self.acc[key] = value if prev is None else self.acc_combine(key, prev, value)


# -- bodies ------------------------------------------------------------------------------------


class _Body:
    """A nested jaxpr as a traceable function of (values, leaves): returns (outputs, output
    sidecars, accumulator dict). The signatures and accumulators of its last trace are kept
    (``sigs``, ``keys``, ``avals``)."""

    def __init__(self, interp: Restaging, jaxpr, consts: list, in_sigs: list, scope: Scope):
        self.interp = interp
        self.jaxpr = jaxpr
        self.consts = consts
        self.in_sigs = in_sigs
        self.scope = scope
        self.const_sides = [interp.const_side(c, "constant") for c in consts]
        self.sigs: list = []
        self.keys: list = []
        self.avals: dict = {}

    def __call__(self, vals: Sequence, leaves: Sequence) -> tuple[list, list, dict]:
        interp = self.interp
        it = iter(leaves)
        sides = [interp.side_build(s, it) for s in self.in_sigs]
        saved, interp.acc = interp.acc, {}
        try:
            outs, osides = interp.run(
                self.jaxpr, self.consts, self.const_sides, list(vals), sides, self.scope
            )
            acc = interp.acc
        finally:
            interp.acc = saved
        self.sigs = [interp.side_sig(s) for s in osides]
        self.keys = list(acc)
        self.avals = {
            k: jax.ShapeDtypeStruct(np.shape(v), jnp.result_type(v)) for k, v in acc.items()
        }
        return list(outs), list(osides), acc

    def trace(self, vals: Sequence, leaves: Sequence) -> None:
        """Trace abstractly (nothing is emitted): fills ``sigs``, ``keys`` and ``avals``."""

        def f(v, lv):
            outs, osides, acc = self(v, lv)
            return outs, _leaves(self.interp, osides, outs, self.sigs), list(acc.values())

        jax.eval_shape(f, _structs(vals), _structs(leaves))


def _structs(xs: Sequence) -> list:
    return [jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in xs]


def _sigs(interp: Restaging, sides: Sequence) -> list:
    return [interp.side_sig(s) for s in sides]


def _leaves(interp: Restaging, sides: Sequence, vals: Sequence, sigs: Sequence) -> list:
    out: list = []
    for s, v, g in zip(sides, vals, sigs, strict=True):
        out += interp.side_leaves(s, v, g)
    return out


def _build(interp: Restaging, sigs: Sequence, leaves: Sequence) -> list:
    it = iter(leaves)
    sides = [interp.side_build(s, it) for s in sigs]
    if next(it, None) is not None:  # pragma: no cover - a side_leaves/side_build mismatch
        raise RuntimeError(f"{type(interp).__name__}: side_build left leaves unread")
    return sides


def _join(interp: Restaging, a: Sequence, b: Sequence) -> list:
    return [interp.side_join(x, y) for x, y in zip(a, b, strict=True)]


def _merge(keys: list, avals: dict, body: _Body) -> None:
    for k in body.keys:
        if k not in avals:
            keys.append(k)
            avals[k] = body.avals[k]


def _thread(interp: Restaging, keys: list, acc: list, new: dict) -> list:
    """The carried accumulators ``acc`` (in ``keys`` order) with a body's ``new`` added."""
    return [interp.acc_combine(k, a, new[k]) if k in new else a for k, a in zip(keys, acc)]


def _emit(interp: Restaging, keys: list, acc: Sequence) -> None:
    for k, v in zip(keys, acc, strict=True):
        interp.accumulate(k, v)


def _carry_fixpoint(
    interp: Restaging, body_of: Callable[[list], _Body], k_sig: list, trace: Callable, nk: int
) -> tuple[list, _Body]:
    """The carry's signature: the initial one joined with what the body returns for it, until
    nothing changes. ``trace(body, k_sig)`` traces ``body`` abstractly; the carry is the first
    ``nk`` outputs."""
    for _ in range(_MAX_FIXPOINT):
        body = body_of(k_sig)
        trace(body, k_sig)
        new = _join(interp, k_sig, body.sigs[:nk])
        if new == k_sig:
            return k_sig, body
        k_sig = new
    raise RuntimeError(  # pragma: no cover - the lattices are finite and shallow
        f"{type(interp).__name__}: a loop carry's sidecar did not converge"
    )


# -- cond ----------------------------------------------------------------------------------------


def restage_cond(interp: Restaging, eqn, invals: list, insides: list, scope: Scope, key: tuple):
    """``lax.switch`` over the branches, each run by the interpreter; the outputs' sidecars
    are the join over branches, accumulators of every branch come out (the identity where a
    branch adds nothing)."""
    idx, ops, osides = invals[0], list(invals[1:]), list(insides[1:])
    sigs = _sigs(interp, osides)
    leaves = _leaves(interp, osides, ops, sigs)
    bodies = []
    out_sig: list | None = None
    keys: list = []
    avals: dict = {}
    for i, br in enumerate(eqn.params["branches"]):
        jaxpr, consts = _compat.closed(br)
        body = _Body(interp, jaxpr, consts, sigs, interp.sub_scope(eqn, scope, (*key, i), "cond"))
        body.trace(ops, leaves)
        out_sig = list(body.sigs) if out_sig is None else _join(interp, out_sig, body.sigs)
        _merge(keys, avals, body)
        bodies.append(body)
    assert out_sig is not None

    def branch(body: _Body):
        def run(ops, leaves):
            outs, osides, acc = body(ops, leaves)
            found = [acc[k] if k in acc else interp.acc_init(k, avals[k]) for k in keys]
            return outs, _leaves(interp, osides, outs, out_sig), found

        return run

    outs, oleaves, acc = lax.switch(idx, [branch(b) for b in bodies], ops, leaves)
    _emit(interp, keys, acc)
    return list(outs), _build(interp, out_sig, oleaves)


# -- scan ----------------------------------------------------------------------------------------


def restage_scan(interp: Restaging, eqn, invals: list, insides: list, scope: Scope, key: tuple):
    """``lax.scan`` with the carry's sidecar at its fixpoint signature, the xs' and ys' leaves
    sliced and stacked with them, and the accumulators in the carry."""
    p = eqn.params
    jaxpr, jconsts = _compat.closed(p["jaxpr"])
    nc, nk = p["num_consts"], p["num_carry"]
    sub = interp.sub_scope(eqn, scope, (*key, "i"), "scan")
    cv, kv, xv = list(invals[:nc]), list(invals[nc : nc + nk]), list(invals[nc + nk :])
    cs, ks, xs = list(insides[:nc]), list(insides[nc : nc + nk]), list(insides[nc + nk :])
    c_sig, x_sig = _sigs(interp, cs), _sigs(interp, xs)
    c_leaves, x_leaves = _leaves(interp, cs, cv, c_sig), _leaves(interp, xs, xv, x_sig)
    x_slice = [jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)) for a in xv]
    xl_slice = [jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)) for a in x_leaves]
    # the values' avals as the equation has them (weak types dropped, as the plain scan does)
    c_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars[: nc + nk]]

    def body_of(k_sig: list) -> _Body:
        return _Body(interp, jaxpr, jconsts, [*c_sig, *k_sig, *x_sig], sub)

    def trace(body: _Body, k_sig: list) -> None:
        body.trace([*c_avals, *x_slice], [*c_leaves, *_leaves(interp, ks, kv, k_sig), *xl_slice])

    k_sig, body = _carry_fixpoint(interp, body_of, _sigs(interp, ks), trace, nk)
    keys, avals = list(body.keys), dict(body.avals)
    k_leaves = _leaves(interp, ks, kv, k_sig)
    ys_sig: list = []

    def step(carry, x):
        kv, kl, acc = carry
        xv, xl = x
        outs, osides, new = body([*cv, *kv, *xv], [*c_leaves, *kl, *xl])
        ys_sig[:] = body.sigs[nk:]
        kl_out = _leaves(interp, osides[:nk], outs[:nk], k_sig)
        if len(kl_out) != len(kl):  # pragma: no cover - a side_leaves that ignores sig
            raise RuntimeError(f"{type(interp).__name__}: a carry's leaves changed in the loop")
        ys = (outs[nk:], _leaves(interp, osides[nk:], outs[nk:], ys_sig))
        return (outs[:nk], kl_out, _thread(interp, keys, acc, new)), ys

    init = [interp.acc_init(k, avals[k]) for k in keys]
    (kv, kl, acc), (ys, yl) = lax.scan(
        step,
        (kv, k_leaves, init),
        (xv, x_leaves),
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    _emit(interp, keys, acc)
    return [*kv, *ys], [*_build(interp, k_sig, kl), *_build(interp, ys_sig, yl)]


# -- while ---------------------------------------------------------------------------------------


def restage_while(interp: Restaging, eqn, invals: list, insides: list, scope: Scope, key: tuple):
    """``lax.while_loop`` with the carry's sidecar at its fixpoint signature. The test runs
    through the interpreter too; when it accumulates something, it is run again in the body
    (the test that let the iteration run) and once after the loop (the one that ended it),
    since a while's test can only return the predicate."""
    p = eqn.params
    cj, cconsts = _compat.closed(p["cond_jaxpr"])
    bj, bconsts = _compat.closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    csub = interp.sub_scope(eqn, scope, (*key, "c"), "while")
    bsub = interp.sub_scope(eqn, scope, (*key, "b"), "while")
    cv, bv, kv = list(invals[:nc]), list(invals[nc : nc + nb]), list(invals[nc + nb :])
    cs, bs, ks = list(insides[:nc]), list(insides[nc : nc + nb]), list(insides[nc + nb :])
    c_sig, b_sig = _sigs(interp, cs), _sigs(interp, bs)
    c_leaves, b_leaves = _leaves(interp, cs, cv, c_sig), _leaves(interp, bs, bv, b_sig)
    b_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars[nc:]]
    k_avals = b_avals[nb:]

    def body_of(k_sig: list) -> _Body:
        return _Body(interp, bj, bconsts, [*b_sig, *k_sig], bsub)

    def trace(body: _Body, k_sig: list) -> None:
        body.trace(b_avals, [*b_leaves, *_leaves(interp, ks, kv, k_sig)])

    k_sig, body = _carry_fixpoint(interp, body_of, _sigs(interp, ks), trace, len(kv))
    test = _Body(interp, cj, cconsts, [*c_sig, *k_sig], csub)
    test.trace([*_structs(cv), *k_avals], [*c_leaves, *_leaves(interp, ks, kv, k_sig)])
    keys, avals = list(body.keys), dict(body.avals)
    _merge(keys, avals, test)
    counts_test = bool(test.keys)

    def tested(kv, kl, acc):
        if not counts_test:
            return acc
        _, _, new = test([*cv, *kv], [*c_leaves, *kl])
        return _thread(interp, keys, acc, new)

    def cond_fun(carry):
        kv, kl, _ = carry
        return test([*cv, *kv], [*c_leaves, *kl])[0][0]

    def body_fun(carry):
        kv, kl, acc = carry
        acc = tested(kv, kl, acc)
        outs, osides, new = body([*bv, *kv], [*b_leaves, *kl])
        return outs, _leaves(interp, osides, outs, k_sig), _thread(interp, keys, acc, new)

    init = [interp.acc_init(k, avals[k]) for k in keys]
    kv, kl, acc = lax.while_loop(cond_fun, body_fun, (kv, _leaves(interp, ks, kv, k_sig), init))
    _emit(interp, keys, tested(kv, kl, acc))
    return list(kv), _build(interp, k_sig, kl)


RESTAGE: dict[Any, Rule] = {
    lax.cond_p: restage_cond,
    lax.scan_p: restage_scan,
    lax.while_p: restage_while,
}


# -- calls that stay calls ---------------------------------------------------------------------


def call_jit(
    interp: Restaging,
    eqn,
    jaxpr,
    consts: list,
    invals: list,
    insides: list,
    scope: Scope,
    cache: dict,
    cache_key: Hashable,
) -> tuple[list, list]:
    """A nested jit stays a jit: the same compiled units as the program (so the same rounding
    when it runs eagerly), traced once per ``(cache_key, input signatures)`` (a net's identical
    layers compile once). ``scope`` is the body's scope; ``cache`` belongs to the caller."""
    sigs = tuple(_sigs(interp, insides))
    ck = (cache_key, sigs)
    ent = cache.get(ck)
    if ent is None or ent[2] is not jaxpr:
        body = _Body(interp, jaxpr, consts, list(sigs), scope)

        def run(vals, leaves):
            outs, osides, acc = body(vals, leaves)
            return outs, _leaves(interp, osides, outs, body.sigs), list(acc.values())

        run.__name__ = str(eqn.params.get("name", "jit"))
        ent = cache[ck] = (jax.jit(run, inline=bool(eqn.params.get("inline"))), body, jaxpr)
    jitted, body, _ = ent
    outs, oleaves, acc = jitted(list(invals), _leaves(interp, insides, invals, sigs))
    _emit(interp, body.keys, acc)
    return list(outs), _build(interp, body.sigs, oleaves)


def call_remat(
    interp: Restaging, eqn, jaxpr, consts: list, invals: list, insides: list, scope: Scope
) -> tuple[list, list]:
    """A ``jax.checkpoint`` stays one, with its policy and ``prevent_cse``: what a program
    differentiated through it stores and recomputes is the user's choice."""
    sigs = _sigs(interp, insides)
    body = _Body(interp, jaxpr, consts, sigs, scope)

    def run(vals, leaves):
        outs, osides, acc = body(vals, leaves)
        return outs, _leaves(interp, osides, outs, body.sigs), list(acc.values())

    ck = jax.checkpoint(
        run, prevent_cse=eqn.params.get("prevent_cse", True), policy=eqn.params.get("policy")
    )
    outs, oleaves, acc = ck(list(invals), _leaves(interp, insides, invals, sigs))
    _emit(interp, body.keys, acc)
    return list(outs), _build(interp, body.sigs, oleaves)
