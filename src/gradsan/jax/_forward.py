"""Outputs a jitted call returns unchanged from its inputs: not that call's findings.

A value that enters a step in its arguments and leaves it unchanged (optax's L-BFGS line
search keeps ``value=inf`` in its state until the first update; a ``lax.cond`` whose taken
branch returns the state as it came) was not computed by the call, so its NaN/Inf is not the
call's to report: the inputs are not the call's to check. Which outputs those are is read from
the step's jaxpr:

- an outvar that is an invar (also through ``jit`` / ``closed_call`` / ``remat`` / custom
  derivative calls, inlined) is always forwarded: left out of the flag, at no cost;
- a ``while_loop`` / ``scan`` carry its body returns as it came is the loop's input;
- an outvar of a ``lax.cond`` / ``lax.switch`` some branch of which returns an input
  unchanged may be forwarded: when it is not finite (checked only then, inside a
  ``lax.cond`` of the flag), it counts as forwarded when the branch the step took returns it
  unchanged. The taken branch is read from the step: its index, computed by the step's own
  equations that lead to it, cut out of the step's jaxpr (on the host: run as a small
  program of its own), so a taken branch that computes exactly the input's value (``s *
  1.0``) is the call's. Where the index cannot be read that way (the cond sits inside a
  nested ``jit`` or another cond's branch, the equations leading to the index have an
  effect, a print or a callback, that must not run twice, or a donated input is gone) the
  output counts as forwarded when it equals that input (NaN where the input has NaN).

An infinite literal in the jaxpr (``jnp.asarray(jnp.inf)``: optax reduce_on_plateau's
``best_value`` sentinel) is the program's constant, not computed: forwarded too. A NaN literal
is not: a program writes one as a signal (``eqx.error_if(..., on_error="nan")``), and it is
reported. Anything an equation
computes is the call's, even a copy (``x + 0``, ``x * 1``, ``jnp.copy``:
XLA may forward those buffers, the program does not), so a NaN gradient computed from NaN data
is still found (a gradient is never a forwarded input).
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


def forwarding(jaxpr: Any, ins: list[Src] | None = None, conds: dict | None = None) -> list[Src]:
    """For each outvar of ``jaxpr`` (a Jaxpr or ClosedJaxpr): where it comes from unchanged.
    ``conds`` (when given) gets, for each output of a ``cond`` equation of ``jaxpr`` itself
    (not nested), ``(the cond's index var, each branch's Src of that output)``."""
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
            if conds is not None:
                for j, v in enumerate(eqn.outvars):
                    conds[v] = (eqn.invars[0], [b[j] for b in per_branch])
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


class Found(NamedTuple):
    """What :func:`_sources` read of one call."""

    outs: list  # the output leaves
    srcs: list  # their Src, in order
    ins: list  # the dynamic input leaves, in the jaxpr's invar order
    branches: dict  # output leaf -> each branch's Src of it (a cond of the step itself)
    index: Any  # (the index program, which inputs it takes, output leaf -> its slot) or None


def _sources(fun: Any, args: tuple, kwargs: dict, out: Any) -> Found | None:
    """The outputs' sources, and which outputs a cond of the step chose (with the program of
    the conds' branch indices), or None when they cannot be matched."""
    try:
        jaxpr = fun.trace(*args, **kwargs).jaxpr
    except Exception:
        return None
    ins = _dynamic(fun, args, kwargs)
    outs = jax.tree_util.tree_leaves(out)
    if ins is None or len(ins) != len(jaxpr.jaxpr.invars):
        return None
    conds: dict = {}
    try:
        srcs = forwarding(jaxpr, conds=conds)
    except Exception:  # pragma: no cover - an equation of a shape not foreseen: flag it all
        return None
    if len(srcs) != len(outs):
        return None
    branches: dict = {}
    slots: dict = {}
    index_vars: list = []
    for i, (v, s) in enumerate(zip(jaxpr.jaxpr.outvars, srcs)):
        if s is None or s[0] or isinstance(v, jcore.Literal) or v not in conds:
            continue
        var, per_branch = conds[v]
        branches[i] = per_branch
        if isinstance(var, jcore.Literal):
            slots[i] = int(var.val)
            continue
        if var not in index_vars:
            index_vars.append(var)
        slots[i] = ("var", index_vars.index(var))
    index = _index_program(jaxpr, index_vars, slots)
    if index is not None:
        index = (*index, {i: len(b) for i, b in branches.items()})
    return Found(outs, srcs, ins, branches, index)


def _index_program(closed: Any, index_vars: list, slots: dict) -> Any:
    """(the step's equations that compute ``index_vars``, alone: a function of the inputs
    ``used`` marks; ``slots``), or None when there are none or they cannot be cut out (then
    a cond's choice is read from its output's value: equal to its input, NaN where NaN)."""
    if not slots:
        return None
    if not index_vars:
        return (None, [], slots)
    try:
        from jax._src.interpreters import partial_eval as pe

        jaxpr = closed.jaxpr
        dbg = jaxpr.debug_info
        dbg = dbg._replace(result_paths=tuple(f"index{k}" for k in range(len(index_vars))))
        cut = jaxpr.replace(outvars=list(index_vars), debug_info=dbg)
        cut, used = pe.dce_jaxpr(cut, [True] * len(index_vars))
        if cut.effects or len(cut.constvars) != len(closed.consts):
            return None  # never run a print or a callback of the step twice
        fun = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(cut, closed.consts))
    except Exception:  # pragma: no cover - an internal API that changed: values decide
        return None
    return (fun, used, slots)


def _taken(index: Any, ins: list, on_host: bool) -> dict:
    """Output leaf -> the branch its cond took (traced, or host ints ``on_host``), clamped
    as ``lax.cond`` clamps its index."""
    fun, used, slots, sizes = index
    vals: list = []
    if fun is not None:
        args = [x for x, u in zip(ins, used) if u]
        vals = list(jax.jit(fun)(*args) if on_host else fun(*args))
    got: dict = {}
    for i, slot in slots.items():
        b = vals[slot[1]] if isinstance(slot, tuple) else slot
        if on_host:
            got[i] = min(max(int(np.asarray(b)), 0), sizes[i] - 1)
        else:
            got[i] = jnp.clip(b, 0, sizes[i] - 1)
    return got


def computed_flag(fun: Any, args: tuple, kwargs: dict, out: Any) -> jax.Array:
    """:func:`finite_flag` of the outputs ``fun`` computed (traced into the fused program):
    an output always returned unchanged from an input is left out; one that may be (a
    ``lax.cond`` branch) counts when it is not finite and the branch taken did not return it
    unchanged (checked only then)."""
    found = _sources(fun, args, kwargs, out)
    if found is None:
        return finite_flag(out)
    computed, maybe = [], []
    for i, (x, s) in enumerate(zip(found.outs, found.srcs)):
        if not _inexact(x) or (s is not None and s[0]):
            continue
        if _decides(found, i) or _candidates(found, i, x):
            maybe.append(i)
        else:
            computed.append(x)
    flag = finite_flag(computed)
    if not maybe:
        return flag
    mx = [found.outs[i] for i in maybe]

    def check(operand: tuple) -> jax.Array:
        xs, ins = operand
        taken = _taken(found.index, ins, False) if found.index is not None else {}
        ok = jnp.array(True)
        for i, x in zip(maybe, xs):
            ok = ok & (jnp.all(jnp.isfinite(x)) | _passed(found, i, x, ins, taken, jnp))
        return ok

    later = jax.lax.cond(finite_flag(mx), lambda p: jnp.array(True), check, (mx, found.ins))
    return flag & later


def _decides(found: Found, i: int) -> bool:
    """Whether output ``i``'s cond choice is read from the branch the step took."""
    return found.index is not None and i in found.index[2]


def _candidates(found: Found, i: int, x: Any, srcs: Any = None) -> list:
    s = found.srcs[i] if srcs is None else srcs
    return [] if s is None else [k for k in sorted(s[1]) if _like(found.ins[k], x)]


def _passed(found: Found, i: int, x: Any, ins: list, taken: dict, xp: Any) -> Any:
    """Whether output ``i`` (``x``) is an input passed through: by the branch its cond took
    (``taken``), else (no index read) by its value, equal to a candidate input."""

    def same_as(ks: list) -> Any:
        got = xp.asarray(False)
        for k in ks:
            got = got | _same_xp(x, ins[k], xp)
        return got

    if not _decides(found, i):
        return same_as(_candidates(found, i, x))
    ok = xp.asarray(False)
    for b, sb in enumerate(found.branches[i]):
        if sb is None:
            continue  # that branch computes it
        this = xp.asarray(True) if sb[0] else same_as(_candidates(found, i, x, sb))
        ok = ok | ((taken[i] == b) & this)
    return ok


def _same_xp(x: Any, y: Any, xp: Any) -> Any:
    if xp is np:
        try:
            y = np.asarray(y)
        except Exception:  # a donated (deleted) input
            return np.asarray(False)
    x = xp.asarray(x)
    return xp.all((x == y) | (xp.isnan(x) & xp.isnan(y)))


def _like(a: Any, x: Any) -> bool:
    return getattr(a, "shape", None) == x.shape and getattr(a, "dtype", None) == x.dtype


def host_computed_flag(fun: Any, args: tuple, kwargs: dict, out: Any) -> bool:
    """:func:`computed_flag` on the host, for outputs already computed: :func:`host_flag`,
    and when that fails, whether every non-finite output was returned unchanged from an
    input (only then is the step's trace read; jax caches it)."""
    if host_flag(out):
        return True
    return forwarded_outputs(fun, args, kwargs, out, stop_at_computed=True) is not None


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


def forwarded_outputs(
    fun: Any, args: tuple, kwargs: dict, out: Any, stop_at_computed: bool = False
) -> Any:
    """The non-finite float outputs (host values) the call did not compute: output leaf index
    -> the input leaf it was returned unchanged from (None: a constant of the program). The
    same decision as the flag's: always forwarded, or a ``lax.cond`` output its taken branch
    returned unchanged. ``stop_at_computed``: None as soon as one non-finite output was
    computed (and when the sources cannot be read)."""
    found = _sources(fun, args, kwargs, out)
    if found is None:
        return None if stop_at_computed else {}
    got: dict[int, int | None] = {}
    cache: dict = {}

    def taken() -> dict:
        if "t" not in cache:  # the branches the step took: read once, when needed
            try:
                cache["t"] = _taken(found.index, found.ins, True)
            except Exception:  # a donated input: the choice is read from the values
                cache["t"] = {}
        return cache["t"]

    for i, (x, s) in enumerate(zip(found.outs, found.srcs)):
        if not _inexact(x):
            continue
        a = np.asarray(x)
        if bool(np.isfinite(a).all()):
            continue
        k = _host_source(found, i, a, s, taken)
        if k is False:
            if stop_at_computed:
                return None
            continue
        got[i] = k
    return got


def _host_source(found: Found, i: int, a: np.ndarray, s: Src, taken: Any) -> Any:
    """Output ``i``'s input (an index, None for a constant), False when the call computed
    it."""
    if s is None:
        return False
    if s[0]:
        return next(iter(s[1]), None)
    if _decides(found, i) and i in taken():
        sb = found.branches[i][taken()[i]]
        if sb is None:
            return False
        return next(iter(sb[1]), None) if sb[0] else _equal_input(found, i, a, sb)
    return _equal_input(found, i, a, s)


def _equal_input(found: Found, i: int, a: np.ndarray, s: Src) -> Any:
    for k in _candidates(found, i, a, s):
        if _host_same(found.ins[k], a):
            return k
    return False


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
