"""Outputs a jitted call returns unchanged from its inputs: not that call's findings.

A value that enters a step in its arguments and leaves it unchanged (optax's L-BFGS line
search keeps ``value=inf`` in its state until the first update; a ``lax.cond`` whose taken
branch returns the state as it came) was not computed by the call, so its NaN/Inf is not the
call's to report: the inputs are not the call's to check. Which outputs those are is read from
the step's jaxpr:

- an outvar that is an invar (also through ``jit`` / ``closed_call`` / ``remat`` / custom
  derivative calls, inlined) is always forwarded: left out of the flag, at no cost;
- a ``while_loop`` / ``scan`` carry its body returns as it came is the loop's input;
- an outvar of a ``lax.cond`` some branch of which returns an input unchanged may be
  forwarded: when it is not finite, it counts as forwarded when it equals that input (NaN
  where the input has NaN), checked only then (inside a ``lax.cond`` of the flag). The taken
  branch is not read (its index is inside the step's program), so a branch that computes
  exactly the input's value, every element, counts as passing it through.

An infinite literal in the jaxpr (``jnp.asarray(jnp.inf)``: optax reduce_on_plateau's
``best_value`` sentinel) is the program's constant, not computed: forwarded too. A NaN literal
is not: a program writes one as a signal (``eqx.error_if(..., on_error="nan")``), and it is
reported. Anything an equation
computes is the call's, even a copy (``x + 0``, ``x * 1``, ``jnp.copy``:
XLA may forward those buffers, the program does not), so a NaN gradient computed from NaN data
is still found (a gradient is never a forwarded input).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from ._flags import _inexact, finite_flag, float_leaves, host_flag

# equations that call one jaxpr with their operands as its inputs, one to one
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
}

# per var: None (computed) or (always, sources): the input positions it may be returned
# unchanged from; always=True when it is that one input on every path
Src = tuple[bool, frozenset] | None


def _open(j: Any) -> Any:
    return getattr(j, "jaxpr", j)


def forwarding(jaxpr: Any, ins: list[Src] | None = None) -> list[Src]:
    """For each outvar of ``jaxpr`` (a Jaxpr or ClosedJaxpr): where it comes from unchanged."""
    jaxpr = _open(jaxpr)
    env: dict[Any, Src] = {}
    for k, v in enumerate(jaxpr.invars):
        env[v] = (True, frozenset([k])) if ins is None else ins[k]

    def read(v: Any) -> Src:
        if isinstance(v, jcore.Literal):  # a constant: an inf is a sentinel, a NaN a signal
            return (True, frozenset()) if _inf_literal(v) else None
        return env.get(v)

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        outs: list[Src] = [None] * len(eqn.outvars)
        param = _CALLS.get(name)
        inner = eqn.params.get(param) if param else None
        if inner is not None and len(_open(inner).invars) == len(eqn.invars):
            got = forwarding(inner, [read(v) for v in eqn.invars])
            if len(got) == len(eqn.outvars):
                outs = got
        elif name == "cond":
            operands = [read(v) for v in eqn.invars[1:]]
            per_branch = [forwarding(b, operands) for b in eqn.params["branches"]]
            outs = [_join([b[j] for b in per_branch]) for j in range(len(eqn.outvars))]
        elif name in ("while", "scan"):
            outs = _loop(eqn, read)
        for v, s in zip(eqn.outvars, outs):
            env[v] = s
    return [read(v) for v in jaxpr.outvars]


def _loop(eqn: Any, read: Any) -> list[Src]:
    """A ``while`` / ``scan`` carry its body returns as it came: the loop's input, unchanged
    after any number of iterations (anything else the loop returns is computed)."""
    p = eqn.params
    if eqn.primitive.name == "while":
        body, consts = p["body_jaxpr"], p["body_nconsts"]
        first, n = p["cond_nconsts"] + consts, len(eqn.outvars)
    else:
        body, consts, n = p["jaxpr"], p["num_consts"], p["num_carry"]
        first = consts
    got = forwarding(body)
    outs: list[Src] = [None] * len(eqn.outvars)
    for j in range(n):
        if got[j] == (True, frozenset([consts + j])):
            outs[j] = read(eqn.invars[first + j])
    return outs


def _join(branches: list[Src]) -> Src:
    got = [b for b in branches if b is not None]
    if not got:
        return None
    srcs = frozenset().union(*(b[1] for b in got))
    always = len(got) == len(branches) and all(b[0] for b in got) and len(srcs) == 1
    return (always, srcs)


def _dynamic(fun: Any, args: tuple, kwargs: dict) -> list | None:
    """The leaves of ``fun``'s non-static arguments, in its jaxpr's invar order."""
    info = getattr(fun, "_jit_info", None)
    if info is None:
        return None
    nums = {n % len(args) for n in info.static_argnums if -len(args) <= n < len(args)}
    names = set(info.static_argnames)
    dyn = tuple(a for i, a in enumerate(args) if i not in nums)
    kw = {k: v for k, v in kwargs.items() if k not in names}
    return jax.tree_util.tree_leaves((dyn, kw))


def _sources(fun: Any, args: tuple, kwargs: dict, out: Any) -> tuple[list, list, list] | None:
    """(output leaves, their sources, input leaves), or None when they cannot be matched."""
    try:
        jaxpr = fun.trace(*args, **kwargs).jaxpr
    except Exception:
        return None
    ins = _dynamic(fun, args, kwargs)
    outs = jax.tree_util.tree_leaves(out)
    if ins is None or len(ins) != len(jaxpr.jaxpr.invars):
        return None
    try:
        srcs = forwarding(jaxpr)
    except Exception:  # pragma: no cover - an equation of a shape not foreseen: flag it all
        return None
    if len(srcs) != len(outs):
        return None
    return outs, srcs, ins


def _same(x: Any, y: Any) -> Any:
    return jnp.all((x == y) | (jnp.isnan(x) & jnp.isnan(y)))


def computed_flag(fun: Any, args: tuple, kwargs: dict, out: Any) -> jax.Array:
    """:func:`finite_flag` of the outputs ``fun`` computed (traced into the fused program):
    an output always returned unchanged from an input is left out; one that may be (a
    ``lax.cond`` branch) counts when it is not finite and differs from that input."""
    found = _sources(fun, args, kwargs, out)
    if found is None:
        return finite_flag(out)
    outs, srcs, ins = found
    computed, maybe = [], []
    for x, s in zip(outs, srcs):
        if not _inexact(x) or (s is not None and s[0]):
            continue
        cands = [] if s is None else [ins[k] for k in sorted(s[1]) if _like(ins[k], x)]
        if cands:
            maybe.append((x, cands))
        else:
            computed.append(x)
    flag = finite_flag(computed)
    if not maybe:
        return flag
    mx = [x for x, _ in maybe]

    def check(pairs: list) -> jax.Array:
        ok = jnp.array(True)
        for x, cands in pairs:
            same = jnp.array(False)
            for c in cands:
                same = same | _same(x, c)
            ok = ok & (jnp.all(jnp.isfinite(x)) | same)
        return ok

    later = jax.lax.cond(finite_flag(mx), lambda p: jnp.array(True), check, maybe)
    return flag & later


def _like(a: Any, x: Any) -> bool:
    return getattr(a, "shape", None) == x.shape and getattr(a, "dtype", None) == x.dtype


def host_computed_flag(fun: Any, args: tuple, kwargs: dict, out: Any) -> bool:
    """:func:`computed_flag` on the host, for outputs already computed: :func:`host_flag`,
    and when that fails, whether every non-finite output was returned unchanged from an
    input (only then is the step's trace read; jax caches it)."""
    if host_flag(out):
        return True
    found = _sources(fun, args, kwargs, out)
    if found is None:
        return False
    for x, s in zip(*found[:2]):
        if not _inexact(x) or bool(np.isfinite(np.asarray(x)).all()):
            continue
        if s is None:
            return False
        if s[0]:
            continue
        a = np.asarray(x)
        if not any(_like(found[2][k], x) and _host_same(found[2][k], a) for k in s[1]):
            return False
    return True


def _host_same(y: Any, a: np.ndarray) -> bool:
    try:
        b = np.asarray(y)
    except Exception:  # a donated (deleted) input
        return False
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def dynamic_labels(fun: Any, args: tuple, kwargs: dict) -> list[str] | None:
    """Names of :func:`_dynamic`'s leaves (``state['best_value']``, ``opt_state[1].count``)."""
    info = getattr(fun, "_jit_info", None)
    if info is None:
        return None
    nums = {n % len(args) for n in info.static_argnums if -len(args) <= n < len(args)}
    names = set(info.static_argnames)
    try:
        import inspect

        params = inspect.signature(getattr(fun, "__wrapped__", fun)).parameters.values()
        arg_names = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        arg_names = []
    tu = jax.tree_util
    labels: list[str] = []
    for i, a in enumerate(args):
        if i in nums:
            continue
        base = arg_names[i] if i < len(arg_names) else f"args[{i}]"
        labels += [base + tu.keystr(p) for p, _ in tu.tree_flatten_with_path(a)[0]]
    for k, v in kwargs.items():
        if k not in names:
            labels += [k + tu.keystr(p) for p, _ in tu.tree_flatten_with_path(v)[0]]
    return labels


def forwarded_outputs(fun: Any, args: tuple, kwargs: dict, out: Any) -> dict[int, int | None]:
    """The non-finite float outputs (host values) the call did not compute: output leaf index
    -> the input leaf it was returned unchanged from (None: a constant of the program). The
    same decision as the flag's: always forwarded, or a ``lax.cond`` output equal to its
    input (NaN where the input has NaN)."""
    found = _sources(fun, args, kwargs, out)
    if found is None:
        return {}
    outs, srcs, ins = found
    got: dict[int, int | None] = {}
    for i, (x, s) in enumerate(zip(outs, srcs)):
        if s is None or not _inexact(x):
            continue
        a = np.asarray(x)
        if bool(np.isfinite(a).all()):
            continue
        if s[0]:
            got[i] = next(iter(s[1]), None)
            continue
        for k in sorted(s[1]):
            if _like(ins[k], x) and _host_same(ins[k], a):
                got[i] = k
                break
    return got


def leave_out_forwarded(
    report: Any, fun: Any, args: tuple, kwargs: dict, out: Any, fwd: dict | None = None
) -> Any:
    """``report`` with only what the call did: outputs returned unchanged from the inputs
    (``fwd``, by default :func:`forwarded_outputs`) are taken out of its findings (a finding
    left with no output is dropped) and named in one note instead."""
    fwd = forwarded_outputs(fun, args, kwargs, out) if fwd is None else fwd
    if not fwd:
        return report
    from ._call import output_labels

    try:
        paths = [p for p, _ in output_labels(fun, out, args, [])]
    except Exception:  # pragma: no cover - an output layout not foreseen: report unchanged
        return report
    if len(paths) != len(jax.tree_util.tree_leaves(out)):
        return report
    gone = {paths[i] for i in fwd}
    kept = []
    for f in report.findings:
        hits = [h for h in f.outputs if h.path not in gone]
        if f.outputs and not hits:
            continue
        f.outputs = hits
        kept.append(f)
    report.findings = kept
    report.notes.append(forwarded_note(fwd, dynamic_labels(fun, args, kwargs) or []))
    return report


def forwarded_note(fwd: dict[int, int | None], in_labels: list[str], most: int = 4) -> str:
    """One line naming the inputs passed through unchanged (and the constants returned)."""
    names: list[str] = []
    for k in fwd.values():
        if k is not None:
            name = in_labels[k] if k < len(in_labels) else f"input leaf {k}"
            if name not in names:
                names.append(name)
    consts = sum(k is None for k in fwd.values())
    parts = []
    n = len(fwd) - consts
    if n:
        shown = ", ".join(names[:most])
        if len(names) > most:
            shown += f" and {len(names) - most} more"
        what = "output is an input" if n == 1 else "outputs are inputs"
        parts.append(
            f"{n} {what} passed through unchanged (already non-finite when given): {shown}"
        )
    if consts:
        what = "output is" if consts == 1 else "outputs are"
        parts.append(f"{consts} {what} the program's constant inf, returned as written")
    return "; ".join(parts) + " (not computed by this call, not its finding)."


__all__ = [
    "computed_flag",
    "dynamic_labels",
    "forwarded_note",
    "float_leaves",
    "forwarded_outputs",
    "forwarding",
    "host_computed_flag",
    "leave_out_forwarded",
]


def _inf_literal(v: Any) -> bool:
    """Whether the literal ``v`` is an infinity (+inf or -inf, no NaN)."""
    try:
        val = np.asarray(v.val)
        return bool(np.all(np.isinf(val))) if val.dtype.kind in "fc" else False
    except Exception:
        return False
