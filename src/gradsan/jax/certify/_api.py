"""gradsan.jax.certify: the arguments, the trace cache, and the combination of the rays'
verdicts into the report."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..._errors import UsageError
from ..._report import Finding, Report
from ..._report._records import OutputHit
from .. import _call, _compat
from ._hull import _directions, _min_norm_leaves, _opposite, _same, _seed
from ._rays import RayResult, _arg_name, _certify_rays, _frame_of
from ._values import Ctx, is_float_aval


def _resolve(
    fun: Callable, argnums: int | tuple[int, ...] | None = None
) -> tuple[Callable, str, int | tuple[int, ...]]:
    """(the loss, "grad" or "loss", argnums): ``jax.grad(loss, argnums=...)`` (or
    ``value_and_grad``) is recognised by :func:`gradsan.jax._compat.grad_info` and unwrapped;
    any other function is the loss itself, differentiated with respect to ``argnums`` (the
    keyword of :func:`certify`, default 0)."""
    info = _compat.grad_info(fun)
    if info is None:
        return fun, "loss", 0 if argnums is None else _argnums(argnums)
    got = info.argnums
    if isinstance(got, tuple) and not got:
        raise UsageError(
            "gradsan.jax.certify: jax.grad(..., argnums=()) has no argument to differentiate"
        )
    if argnums is not None and _argnums(argnums) != got:
        raise UsageError(
            f"gradsan.jax.certify: argnums={argnums!r}, but the gradient given is taken with "
            f"respect to argnums={got!r}; pass the loss itself with argnums, or the gradient alone"
        )
    return info.fun, "grad", got


def _argnums(argnums: Any) -> int | tuple[int, ...]:
    if isinstance(argnums, int) and not isinstance(argnums, bool):
        return argnums
    if (
        isinstance(argnums, (tuple, list))
        and argnums
        and all(isinstance(i, int) and not isinstance(i, bool) for i in argnums)
    ):
        return tuple(argnums)
    raise UsageError(
        f"gradsan.jax.certify: argnums must be an int or a non-empty tuple of ints, got {argnums!r}"
    )


def _mover(loss: Callable, argnums, n: int) -> Callable:
    """The loss as a function of its differentiated arguments first (one pytree: the argument,
    or a tuple of them for a tuple ``argnums``), then the others in order, for ``n`` positional
    arguments."""
    idx = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    bad = [i for i in idx if not -n <= i < n]
    if bad:
        raise UsageError(
            f"gradsan.jax.certify: argnums {argnums} but the function was called "
            f"with {n} positional argument(s)"
        )
    idx = tuple(i % n for i in idx)
    rest_pos = [i for i in range(n) if i not in idx]

    @functools.wraps(loss)
    def moved(p, *rest, **kwargs):
        full: list = [None] * n
        for i, r in zip(rest_pos, rest):
            full[i] = r
        for i, v in zip(idx, (p,) if isinstance(argnums, int) else p):
            full[i] = v
        return loss(*full, **kwargs)

    def select(args: tuple) -> tuple:
        p = args[idx[0]] if isinstance(argnums, int) else tuple(args[i] for i in idx)
        return (p, *(args[i] for i in rest_pos))

    moved.__gradsan_argnums__ = idx  # type: ignore[attr-defined]
    moved.select = select  # type: ignore[attr-defined]
    return moved


def _nonfinite_input(f: Callable, name: str, args: tuple, kwargs: dict) -> Report | None:
    """When a NaN or Inf already in the arguments reaches the gradient there is no limit to
    certify: the report names that input (explain's finding), never "undecided"."""
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    if all(
        np.isfinite(np.asarray(x)).all()
        for x in leaves
        if hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)
    ):
        return None
    from .._explain import diagnose

    found = diagnose(jax.grad(f), args, kwargs, who="certify")
    inputs = [x for x in found.findings if x.catalog_id == "nonfinite-input"]
    if not inputs:
        return None
    report = Report(outputs=None, function=name, backend="jax")
    report.findings.extend(inputs)
    report.notes.append(
        "certify: the gradient is non-finite because an argument already holds NaN or Inf; "
        "there is no limit to certify at this point."
    )
    return report


def certify(
    fun: Callable,
    *,
    directions: Sequence | None = None,
    num_directions: int = 2,
    terms: int = 4,
    key: Any = None,
    argnums: int | tuple[int, ...] | None = None,
) -> Callable[..., Report]:
    """Certified limits of the gradient of a scalar loss at a point (theory.md 6.5, Tier B/C).

    ``fun`` is a scalar loss (its gradient with respect to the first argument is certified) or
    ``jax.grad(loss)``. Returns a function of the arguments that returns a :class:`Report`:
    ``report.outputs`` is the certified gradient (same pytree as the first argument) or None;
    the one finding (kind ``"certified"``) carries ``detail["label"]`` ("gradient",
    "clarke-subgradient", "singular" or "undecided"), ``detail["verdicts"]`` per direction (a
    ray's gradient is a list per parameter leaf: nested lists, or numpy arrays beyond 100,000
    numbers) and the certificate text. Calling the returned function again with arrays of the
    same shapes reuses the trace of the loss.

    ``argnums`` (default 0) says which positional arguments of the loss the gradient is taken
    with respect to, as in ``jax.grad``; for ``jax.grad(loss, argnums=...)`` it is read from
    the gradient itself.
    """
    if not callable(fun):
        raise UsageError(
            f"gradsan.jax.certify takes a function, got {type(fun).__name__}. "
            "Wrap the loss, then call it: gradsan.jax.certify(loss)(params)"
        )
    loss, how, argnums = _resolve(fun, argnums)
    name = getattr(loss, "__name__", "function")
    traced: dict = {}  # jitted flat losses by argument structure: jit caches their traces
    moved_by_n: dict = {}  # the loss with its differentiated arguments moved first, per len(args)

    def run(*args, **kwargs) -> Report:
        if not args:
            raise UsageError("gradsan.jax.certify: call with the parameters as first argument")
        # certify reads values (rays from the point): inside jit, vmap or grad there are none
        _call.check_not_traced(jax.tree_util.tree_leaves((args, kwargs)), "certify")
        f: Any = loss
        if argnums != 0:
            f = moved_by_n.get(len(args))
            if f is None:
                f = moved_by_n[len(args)] = _mover(loss, argnums, len(args))
            args = f.select(args)
        bad_input = _nonfinite_input(f, name, args, kwargs)
        if bad_input is not None:
            return bad_input
        with jax.enable_x64(True):
            return _run(f, how, name, args, kwargs, directions, num_directions, terms, key, traced)

    return run


def _trace(loss, traced: dict, treedef, x0s: list, rest: tuple, kwargs: dict):
    """(closed jaxpr, data): the loss as a jaxpr of the parameter leaves followed by the array
    leaves of the other arguments (``data``, passed as values), through a jitted function kept
    per argument structure, so that calling certify again with arrays of the same shapes reuses
    jit's trace. Where an argument is not an array (a Python flag, a key), the other arguments
    are closed over instead (``data`` empty), as constants of a fresh trace."""
    rl, rtree = jax.tree_util.tree_flatten((rest, kwargs))
    # float data in float64, like the parameters: f(x0) must not carry float32 rounding (which
    # an arccos near 1 magnifies 10^4 times) into the comparison with the limits
    rl = [
        np.asarray(a, np.float64)
        if isinstance(a, (np.ndarray, np.generic, jax.Array))
        and np.issubdtype(a.dtype, np.floating)
        else a
        for a in rl
    ]
    rest, kwargs = jax.tree_util.tree_unflatten(rtree, rl)
    arrays = all(
        isinstance(a, (np.ndarray, np.generic, jax.Array))
        and (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_)
        for a in rl
    )
    if arrays:
        n = len(x0s)
        k = (treedef, rtree, n)
        jf = traced.get(k)
        if jf is None:

            def flat(*ls):
                r, kw = jax.tree_util.tree_unflatten(rtree, list(ls[n:]))
                return loss(jax.tree_util.tree_unflatten(treedef, list(ls[:n])), *r, **kw)

            jf = traced[k] = jax.jit(flat)
        if jf is not False:
            try:
                got = jf.trace(*x0s, *rl).jaxpr
                # an outer tracer the loss closes over is one more input of jit's trace
                if len(got.jaxpr.invars) == n + len(rl):
                    return got, [np.asarray(a) for a in rl]
                traced[k] = False  # the trace below has it as a constant: the error says so
            except Exception:
                traced[k] = False  # not traceable with its data as inputs: use constants

    def flat_loss(*ls):
        return loss(jax.tree_util.tree_unflatten(treedef, list(ls)), *rest, **kwargs)

    try:
        closed = jax.make_jaxpr(flat_loss)(*x0s)
    except _call.VALUE_ERRORS as e:  # `if x > 0:` on a traced value: name the user's line
        raise _call.control_flow_error(e, "certify") from e
    except TypeError as e:
        raise UsageError(f"gradsan.jax.certify could not trace the function: {e}") from e
    if any(isinstance(c, jax.core.Tracer) for c in closed.consts):
        raise UsageError(_call._CLOSES.format(who="certify"))
    return closed, []


def _run(
    loss, how, name, args, kwargs, directions, num_directions, terms, key, traced: dict
) -> Report:
    params, rest = args[0], args[1:]
    leaves, treedef = jax.tree_util.tree_flatten(params)
    for x in leaves:
        if isinstance(x, (str, bytes)) or not np.issubdtype(np.asarray(x).dtype, np.number):
            raise UsageError(
                "gradsan.jax.certify: the first argument must be an array or a "
                "pytree of float arrays"
            )
        if not np.issubdtype(np.asarray(x).dtype, np.floating):
            raise UsageError(
                "gradsan.jax.certify: the first argument has integer leaves; "
                "gradients need float parameters (jnp.asarray(x, float))"
            )
    x0s = [np.asarray(x, np.float64) for x in leaves]
    closed, data = _trace(loss, traced, treedef, x0s, rest, kwargs)
    out_avals = closed.out_avals
    if len(out_avals) != 1 or tuple(out_avals[0].shape) != () or not is_float_aval(out_avals[0]):
        what = (
            "a gradient program that is not jax.grad(loss)"
            if how == "loss"
            and len(out_avals) != 1
            or (out_avals and tuple(out_avals[0].shape) != ())
            else "a non-scalar"
        )
        raise UsageError(
            f"gradsan.jax.certify needs a scalar loss or jax.grad(loss); {name} returns "
            f"{len(out_avals)} output(s) of shape {[tuple(a.shape) for a in out_avals]} "
            f"({what}). For a training step, certify the loss it differentiates: "
            "gradsan.jax.certify(loss)(params, batch)"
        )
    if directions is None:  # random ones: the same for the same shapes and key, kept
        dk = ("directions", tuple(np.shape(x) for x in x0s), num_directions, _seed(key))
        dirs = traced.get(dk)
        if dirs is None:
            dirs = traced[dk] = _directions(x0s, None, num_directions, key)
    else:
        dirs = _directions(x0s, directions, num_directions, key)
    ctx = Ctx(data=data)
    fx0, results = _certify_rays(ctx, closed, x0s, dirs, terms, data, traced)
    return _combine(loss, name, treedef, x0s, dirs, results, ctx, fx0, terms)


def _combine(
    loss, name, treedef, x0s, dirs, results: list[RayResult], ctx: Ctx, fx0, terms
) -> Report:
    verdicts = [r.to_dict(i) for i, r in enumerate(results)]
    notes: list = []
    differentiable: bool | None = None
    outputs = None
    defined = [r for r in results if r.verdict in ("DEFINED", "REMOVABLE")]
    singular = [r for r in results if r.verdict in ("SINGULAR", "DISCONTINUOUS")]
    undecided = [r for r in results if r.verdict == "UNDECIDED"]
    domain = [r for r in results if r.verdict == "DOMAIN"]
    lims = [r.limit for r in defined if r.verdict == "REMOVABLE" and r.limit is not None]
    if not singular and lims and max(lims) - min(lims) > 1e-9 * (1 + max(map(abs, lims))):
        # f(x0) is NaN and the rays tend to different values: a jump, not a removable point
        i = next(i for i, r in enumerate(results) if r.limit == min(lims))
        k = next(i for i, r in enumerate(results) if r.limit == max(lims))
        singular = [
            RayResult(
                "DISCONTINUOUS",
                certificate=(
                    f"f(x0) is NaN and f(x0 + t v) tends to {min(lims):.10g} along direction {i} but "
                    f"to {max(lims):.10g} along direction {k}: no limit at x0"
                ),
            )
        ]
    if singular:
        label = "singular"
        r = singular[0]
        differentiable = (
            False
            if (
                r.verdict == "DISCONTINUOUS"
                or r.fprime is not None
                and math.isinf(r.fprime)
                or "value diverges" in r.certificate
            )
            else None
        )
        cert = f"{r.verdict}: {r.certificate}"
        if differentiable is False:
            cert += "; f is not differentiable at x0"
    elif undecided:
        label = "undecided"
        cert = "UNDECIDED: " + "; ".join(undecided[0].notes or ["the rules could not decide"])
    elif not defined:
        label = "singular"
        cert = "DOMAIN: every ray tried leaves the domain of f"
        differentiable = False
    else:
        grads: list = [r.gradient for r in defined]
        all_same = all(_same(grads[0], g) for g in grads[1:])
        opposite = []
        for i, di in enumerate(dirs):
            for k, dk in enumerate(dirs):
                if k > i and _opposite(di, dk):
                    ri, rk = results[i], results[k]
                    if (
                        ri.fprime is not None
                        and rk.fprime is not None
                        and ri.verdict in ("DEFINED", "REMOVABLE")
                        and rk.verdict in ("DEFINED", "REMOVABLE")
                    ):
                        opposite.append(ri.fprime + rk.fprime)
        kink = any(abs(s) > 1e-9 * (1 + max(abs(r.fprime or 0) for r in defined)) for s in opposite)
        if all_same and not kink:
            label = "gradient"
            outputs_flat = grads[0]
            differentiable = None if domain else True
            cert = (
                "the limit of the gradient along every ray tried is the same: "
                "lim_{t->0+} grad f(x0 + t v)"
            )
            if domain:
                cert += (
                    f" (one-sided: {len(domain)} of {len(results)} rays leave the domain, "
                    "x0 is on the boundary of the domain)"
                )
            if any(r.verdict == "REMOVABLE" for r in defined):
                cert += "; f(x0) is NaN but the singularity is removable"
        else:
            label = "clarke-subgradient"
            differentiable = False
            outputs_flat = _min_norm_leaves(grads)
            why = (
                "two different limits of the gradient"
                if not all_same
                else "f'(x0; v) + f'(x0; -v) != 0"
            )
            cert = (
                f"not differentiable at x0 ({why}); the minimum-norm element of the convex "
                "hull of the limits is a Clarke subgradient (when f is locally Lipschitz "
                "near x0)"
            )
        outputs = jax.tree_util.tree_unflatten(treedef, [np.asarray(g) for g in outputs_flat])
    if ctx.unverified:
        notes.append(
            "unverified: primitives treated as analytic via repeated JVPs: "
            + ", ".join(sorted(ctx.unverified))
        )
    detail = {
        "label": label,
        "verdicts": verdicts,
        "certificate": cert,
        "differentiable": differentiable,
        "f(x0)": fx0,
        "terms": terms,
        "unverified": sorted(ctx.unverified),
    }
    title = {
        "gradient": "certified gradient (ray limit)",
        "clarke-subgradient": "not differentiable: a Clarke subgradient",
        "singular": "no gradient: singular",
        "undecided": "undecided",
    }[label]
    expl_lines = [cert] + [
        f"  direction {v['direction']}: {v['verdict']}"
        + (f" -- {v['certificate']}" if v["certificate"] else "")
        + (f" [{'; '.join(v['notes'])}]" if v["notes"] else "")
        for v in verdicts
    ]
    finding = Finding(
        kind="certified",  # type: ignore[arg-type]  # missing from Finding.kind (gradsan._report)
        catalog_id=None,
        phase="gradient",  # type: ignore[arg-type]
        primitive="gradsan.jax.certify",
        where=_frame_of(loss),
        result=title,
        title=title,
        explanation="\n".join(expl_lines),
        detail=detail,
        outputs=[
            OutputHit(
                path=_arg_name(loss),
                count=sum(x.size for x in x0s),
                size=sum(x.size for x in x0s),
                kind="grad",
            )
        ],
    )
    return Report(findings=[finding], outputs=outputs, function=name, backend="jax", notes=notes)
