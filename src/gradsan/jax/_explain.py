"""gradsan.jax.explain: interpret the program, blame along the dataflow, build the Report."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _catalog
from .._catalog._classify import classify
from .._errors import UsageError
from .._report import Finding, OutputHit, Report
from .._report._build import catalog_finding
from .._report._format import format_value
from . import _rules
from ._interpret import FINITE, INF, NAN, Interpreter, Node, group_key
from ._source import custom_vjp_rule_frame, exclude_gradsan

exclude_gradsan()


# -- one call, flattened ------------------------------------------------------------------------


class FlatCall(NamedTuple):
    """``fun(*args, **kwargs)`` as a function of its flat array leaves. A jitted ``fun``'s
    static arguments stay Python values, bound in ``fun`` (they flatten to no leaves)."""

    flat: list
    in_tree: Any
    fun: Callable  # flat leaves -> outputs; a fresh closure per call (make_jaxpr caches per callable)
    dyn_args: tuple
    dyn_kwargs: dict
    statics: tuple  # the static values, hashable (a cache key together with in_tree)


def flatten_call(
    fun: Callable, args: tuple, kwargs: dict, traced: Callable | None = None
) -> FlatCall:
    info = getattr(fun, "_jit_info", None)
    s_pos = set(getattr(info, "static_argnums", ()) or ())
    s_names = set(getattr(info, "static_argnames", ()) or ())
    dyn_args = tuple(None if i in s_pos else a for i, a in enumerate(args))
    dyn_kwargs = {k: (None if k in s_names else v) for k, v in kwargs.items()}
    flat, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
    pos = {i: args[i] for i in s_pos if i < len(args)}
    names = {k: kwargs[k] for k in s_names if k in kwargs}
    target = traced or fun

    def flat_fun(*leaves):
        a, k = jax.tree_util.tree_unflatten(in_tree, list(leaves))
        a = tuple(pos[i] if i in pos else x for i, x in enumerate(a))
        k = {n: (names[n] if n in names else x) for n, x in k.items()}
        return target(*a, **k)

    statics = (tuple(sorted(pos.items())), tuple(sorted(names.items())))
    return FlatCall(flat, in_tree, flat_fun, dyn_args, dyn_kwargs, statics)


# -- input checks -------------------------------------------------------------------------------


def check_callable(fun: Any, who: str) -> None:
    if not callable(fun):
        raise UsageError(
            f"gradsan.jax.{who} takes a function, got {type(fun).__name__} {fun!r:.60}. "
            f"Wrap the function, then call it: gradsan.jax.{who}(jax.grad(loss))(params)"
        )


def check_args(flat_args: list, labels: list[str], who: str) -> None:
    for a, label in zip(flat_args, labels):
        if isinstance(a, (str, bytes)):
            raise UsageError(
                f"gradsan.jax.{who}: argument `{label}` is a {type(a).__name__} ({a!r:.40}); "
                "JAX can only trace arrays and numbers. Bind non-array arguments first: "
                f"gradsan.jax.{who}(functools.partial(fun, {label.split('[')[0]}={a!r:.20}))(...)"
            )
        if not (
            isinstance(a, (jax.Array, np.ndarray, np.generic, int, float, complex, bool))
            or hasattr(a, "__jax_array__")
            or hasattr(a, "dtype")
        ):
            raise UsageError(
                f"gradsan.jax.{who}: argument `{label}` is a {type(a).__name__}, which JAX cannot "
                "trace. Pass arrays (jnp.asarray(x)) or bind it with functools.partial."
            )


def arg_labels(fun: Callable, args: tuple, kwargs: dict) -> tuple[list[str], list]:
    """Names for the flattened arguments: ``theta``, ``params['w']``."""
    try:
        sig = inspect.signature(fun)
        names = [
            p.name
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        names = []
    labels: list[str] = []
    leaves: list = []
    for i, a in enumerate(args):
        base = names[i] if i < len(names) and not names[i].startswith("*") else f"args[{i}]"
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            labels.append(base + jax.tree_util.keystr(path))
            leaves.append(leaf)
    for k, a in kwargs.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            labels.append(k + jax.tree_util.keystr(path))
            leaves.append(leaf)
    return labels, leaves


def output_labels(
    fun: Callable, out_shape: Any, args: tuple, in_labels: list[str]
) -> list[tuple[str, str]]:
    """(path, kind) of each output leaf. Gradients are named after their argument (kind
    "grad"), value_and_grad's value is "value", anything else is "output"."""
    tree = jax.tree_util
    paths = [tree.keystr(p) for p, _ in tree.tree_flatten_with_path(out_shape)[0]]
    doc = getattr(fun, "__doc__", None) or ""
    # in_labels are the flattened arguments' names; split them per positional argument
    starts = [0]
    for a in args:
        starts.append(starts[-1] + len(tree.tree_leaves(a)))
    per_arg = [in_labels[starts[i] : starts[i + 1]] for i in range(len(args))]

    def grads_of(shape) -> list[tuple[str, str]] | None:
        if args and tree.tree_structure(shape) == tree.tree_structure(args[0]):
            return [(lbl, "grad") for lbl in per_arg[0]]
        if (
            isinstance(shape, tuple)
            and 0 < len(shape) <= len(args)
            and all(tree.tree_structure(s) == tree.tree_structure(a) for s, a in zip(shape, args))
        ):  # argnums=(0, 1, ...)
            return [(lbl, "grad") for i in range(len(shape)) for lbl in per_arg[i]]
        return None

    if (
        doc.startswith("Value and gradient of")
        and isinstance(out_shape, tuple)
        and len(out_shape) == 2
    ):
        g = grads_of(out_shape[1])
        if g is not None:
            n_val = len(tree.tree_leaves(out_shape[0]))
            if isinstance(out_shape[0], tuple) and len(out_shape[0]) == 2:  # has_aux
                vals = [
                    ("value" + p[6:] if p.startswith("[0][0]") else "aux" + p[6:], "value")
                    for p in paths[:n_val]
                ]
            else:
                vals = [("value" + p[3:], "value") for p in paths[:n_val]]
            return vals + g
    g = grads_of(out_shape)
    if g is not None and (doc.startswith("Gradient of") or not doc.startswith("Value and")):
        return g
    return [(("output" + p) if p else "output", "output") for p in paths]


# -- blame --------------------------------------------------------------------------------------


def _stat(src) -> int:
    return FINITE if src is None else src[0].status[src[1]]


class Blame:
    """Follows non-finite values back along the dataflow to where they were born.

    For each value it finds the origins: an origin has only finite inputs (or is an input or a
    constant). With each origin comes its poison: the node where NaN appeared from inf but not
    NaN inputs, which is where the inf met a zero. Results are memoized per node, so blaming
    every output of a large model walks the non-finite subgraph once. An intentional inf (a
    -inf mask constant) is not an origin: the NaN was born where two such infinities met.
    """

    def __init__(self) -> None:
        self.memo: dict[tuple[int, int], dict[int, tuple[Node, Node | None]]] = {}

    @staticmethod
    def _children(node: Node, k: int) -> list:
        if node.kind in ("input", "const"):
            return []
        bad = [s for s in node.ins if _stat(s) != FINITE]
        if node.kind == "stack":
            return bad[:1]
        if node.status[k] == NAN:
            nan_in = [s for s in bad if _stat(s) == NAN]
            return nan_in or bad
        return bad

    def _combine(self, node: Node, k: int, children: list) -> dict:
        if not children:
            return {id(node): (node, None)}
        bad = [s for s in node.ins if _stat(s) != FINITE]
        is_poison = (
            node.kind == "eqn" and node.status[k] == NAN and not any(_stat(s) == NAN for s in bad)
        )
        out: dict[int, tuple[Node, Node | None]] = {}
        for c in children:
            for key, (origin, poison) in self.memo[(id(c[0]), c[1])].items():
                if is_poison and origin.kind == "const":
                    out.setdefault(id(node), (node, None))
                    continue
                if poison is None and is_poison:
                    poison = node
                out.setdefault(key, (origin, poison))
        return out

    def origins(self, src) -> list[tuple[Node, Node | None]]:
        stack = [(src, False)]
        while stack:
            (node, k), expanded = stack.pop()
            key = (id(node), k)
            if key in self.memo:
                continue
            children = self._children(node, k)
            if expanded:
                self.memo[key] = self._combine(node, k, children)
                continue
            stack.append(((node, k), True))
            for c in children:
                if (id(c[0]), c[1]) not in self.memo:
                    stack.append((c, False))
        found = list(self.memo[(id(src[0]), src[1])].values())
        real = [f for f in found if f[0].kind != "const"]
        return real or found


def _forward_node(interp: Interpreter, origin: Node) -> Node | None:
    """The primal operation the origin belongs to: sqrt for sqrt's jvp coefficient.

    Operations at the same source position in the same scope form a group (the primal op and
    the equations of its derivative rule). The primal op is the group's hit that does not
    itself consume another group member's output (the coefficient ``0.5 / sqrt(x)`` does).
    """
    cands = interp.hits_by_key.get(group_key(origin.scope, origin.place)) if origin.place else None
    if cands:
        # a kink (a max tie among -inf logits) does not make a non-finite value
        cands = [c for c in cands if _entry_kind(c.hit.entry_id) != "kink"]
    if cands:
        before = [c for c in cands if c.seq <= origin.seq] or cands
        latest = before[-1]
        # the first hit of the latest run: the primal op precedes its jvp rule's equations
        return next(c for c in before if getattr(c, "run", None) == getattr(latest, "run", None))
    if origin.hit is not None and _entry_kind(origin.hit.entry_id) != "kink":
        return origin
    # a few hops back along the inputs (the coefficient of acos is rsqrt(1 - x*x))
    frontier = [s[0] for s in origin.ins if s is not None]
    for _ in range(3):
        nxt = []
        for n in frontier:
            if n.hit is not None and _entry_kind(n.hit.entry_id) != "kink":
                return n
            nxt += [s[0] for s in n.ins if s is not None]
        frontier = nxt
    return None


def _entry_kind(entry_id: str) -> str:
    try:
        return _catalog.get(entry_id).kind
    except KeyError:
        return ""


def _result_word(node: Node) -> str:
    if node.outs is not None and node.first_bad is not None:
        for o in node.outs:
            a = np.asarray(o)
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                v = a[node.first_bad] if a.ndim == len(node.first_bad) else a.flat[0]
                return format_value(v)
    return {NAN: "nan", INF: "inf"}.get(max(node.status), "nan")


def _at(arr: np.ndarray, idx: tuple, shape: tuple) -> Any:
    a = np.broadcast_to(arr, shape) if np.shape(arr) != shape else arr
    return a[idx] if len(idx) == a.ndim else a.flat[0]


def _poison_details(poison: Node) -> dict[str, Any]:
    """Which indeterminate form, and which operand supplied the zero."""
    prim = poison.prim
    ops = poison.operands or []
    idx = poison.first_bad or ()
    out_shape = np.shape(poison.outs[0]) if poison.outs else ()
    vals = []
    for o in ops:
        try:
            vals.append(_at(o, idx, out_shape))
        except (ValueError, IndexError):
            vals.append(None)
    res: dict[str, Any] = {"form": None, "zero_operand": None, "text": ""}
    if prim == "mul" and len(vals) == 2 and all(v is not None for v in vals):
        a, b = (float(np.real(v)) for v in vals)
        if a == 0 and np.isinf(b):
            res.update(
                form="0*inf",
                zero_operand=0,
                text=f"{format_value(vals[0])} * {format_value(vals[1])} = nan",
            )
        elif b == 0 and np.isinf(a):
            res.update(
                form="0*inf",
                zero_operand=1,
                text=f"{format_value(vals[0])} * {format_value(vals[1])} = nan",
            )
    elif prim == "div" and len(vals) == 2 and all(v is not None for v in vals):
        a, b = (float(np.real(v)) for v in vals)
        if a == 0 and b == 0:
            res.update(form="0/0", zero_operand=0, text="0.0 / 0.0 = nan")
        elif np.isinf(a) and np.isinf(b):
            res.update(
                form="inf/inf", text=f"{format_value(vals[0])} / {format_value(vals[1])} = nan"
            )
    elif prim in _rules.SUM_PRIMS:
        res.update(form="inf-inf", text="inf + (-inf) = nan")
    elif prim in _rules.PRODUCT_PRIMS:
        has_zero = any(np.any(np.asarray(o) == 0) for o in ops)
        res.update(
            form="0*inf" if has_zero else "inf-inf",
            text=f"0 * inf or inf - inf inside {prim} = nan",
        )
    else:
        res.update(text=f"{prim} of an infinite input = nan")
    return res


def _origin_finding(
    interp: Interpreter, origin: Node, poison: Node | None, hits: list[OutputHit]
) -> Finding:
    if origin.kind in ("input", "const"):
        a = origin.outs[0] if origin.outs else np.array(np.nan)
        bad = ~np.isfinite(a)
        got = format_value(a[origin.first_bad] if origin.first_bad else a.flat[0])
        label = f"`{origin.label}`" if origin.kind == "input" else origin.label
        f = catalog_finding(
            backend="jax",
            entry_id="nonfinite-input",
            phase="value",
            primitive="input" if origin.kind == "input" else "constant",
            where=None,
            result=got,
            count=int(bad.sum()),
            size=int(a.size),
            index=origin.first_bad,
            outputs=hits,
            detail={"input": origin.label},
        )
        f.values = f"{label} holds {got} in {int(bad.sum())} of {a.size} elements" + (
            f", first at {list(origin.first_bad)}" if origin.first_bad else ""
        )
        return f
    fwd = _forward_node(interp, origin)
    result = _result_word(origin)
    lib = origin.library or (fwd.library if fwd is not None else None)
    entry_id = None
    got = count = size = index = None
    primitive = origin.prim
    if fwd is not None:
        h = fwd.hit
        entry_id, got, count, size, index = h.entry_id, h.got, h.count, h.size, h.index
        primitive = fwd.prim
    else:
        op = _rules.canonical_op(origin.prim)
        hit = _overflow_hit(origin)
        if hit is None and op is not None:
            hit = classify(
                op,
                origin.operands or [],
                origin.outs[0] if origin.outs else None,
                _rules.params_for(origin.prim, origin.eqn.params),
            )
        if hit is not None:
            entry_id, got, count, size, index = (
                hit.entry_id,
                hit.got,
                hit.count,
                int(hit.mask.size),
                hit.first_index,
            )
    overflow = _overflow_hit(origin) if fwd is None or fwd is origin else None
    if overflow is not None:  # float16/bfloat16: the same value fits in float32
        entry_id, got, count, size, index = (
            overflow.entry_id,
            overflow.got,
            overflow.count,
            int(overflow.mask.size),
            overflow.first_index,
        )
    if lib is not None:
        lib_entry = _catalog.for_library(lib)
        if lib_entry is not None and (entry_id is None or lib_entry.op != "input"):
            entry_id = lib_entry.id
    # a value, not a gradient, when the origin is a primal operation: not transposed, and the
    # first equation at its source position (a derivative rule's equations come after it)
    first = interp.group_first.get(group_key(origin.scope, origin.place)) if origin.place else None
    value_phase = not getattr(origin, "backward", False) and (
        fwd is origin or (fwd is None and first == origin.seq)
    )
    where = (fwd or origin).user_frame
    if (
        fwd is None
        and getattr(origin, "backward", False)
        and origin.place is not None
        and origin.place.custom_vjp
        and where is not None
    ):
        # born in a custom_vjp backward rule, whose equations carry the call site (P3)
        rule = custom_vjp_rule_frame(where, origin.prim)
        if rule is not None:
            detail_call_site = where
            where = rule
            lib = None
        else:
            detail_call_site = None
    else:
        detail_call_site = None
    detail: dict[str, Any] = {"origin_op": origin.prim}
    if detail_call_site is not None:
        detail["custom_vjp_call"] = str(detail_call_site)
        detail["note"] = f"in the custom_vjp backward rule called at {detail_call_site}"
    if "note" in detail:
        pass
    elif fwd is not None and fwd is not origin:
        detail["note"] = (
            f"its derivative is {result} there"
            if result != "nan"
            else "its derivative rule gave nan there"
        )
    else:
        detail["note"] = f"it returned {result}"
    zero_from = met_where = None
    form = met_op = None
    if poison is not None:
        pd = _poison_details(poison)
        form, met_op = pd["form"], poison.prim
        met_where = poison.user_frame
        phase = "backward " if getattr(poison, "backward", False) else ""
        detail["met_text"] = f"{pd['text']} in the {phase}`{poison.prim}`" if pd["text"] else ""
        detail["met_value"] = result
        if pd["zero_operand"] is not None:
            zsrc = poison.ins[pd["zero_operand"]]
            if zsrc is not None:
                zero_from = zsrc[0].user_frame
                detail["met_text"] = "the zero came from here: " + detail["met_text"]
            else:
                detail["met_text"] += " (the zero is a constant)"
                zero_from = poison.user_frame
        if form == "inf-inf":
            zero_from = None
    ctx = origin.scope.context if origin.scope else ""
    if poison is not None and poison.scope is not None and poison.scope.context and not ctx:
        ctx = poison.scope.context
    shown = "nan" if any(h.nan for h in hits) else result
    f = catalog_finding(
        backend="jax",
        entry_id=entry_id,
        phase="value" if value_phase else "gradient",
        primitive=primitive,
        where=where,
        result=shown,
        backend_op=f"{origin.prim}" + (" (backward)" if getattr(origin, "backward", False) else ""),
        got=got,
        count=count or 0,
        size=size or 0,
        index=index,
        library=lib,
        zero_from=zero_from,
        form=form,
        met_op=met_op,
        met_where=met_where,
        context=ctx,
        scope=origin.scope.path if origin.scope else "",
        outputs=hits,
        detail=detail,
    )
    if origin.prim == "shard_map":
        f.where = getattr(origin, "body_frame", None) or f.where
        f.primitive = getattr(origin, "body_prim", "shard_map")
        f.library = "shard_map"
        f.explanation = (
            f"The non-finite value was born inside a shard_map, which gradsan runs as one "
            f"operation (its per-shard body is not interpreted yet). The line shown is the "
            f"body's first `{f.primitive}`; run gradsan.jax.explain on the body function with "
            "one shard's inputs to locate it exactly."
        )
        return f
    if (
        entry_id is None
        and poison is None
        and origin.status
        and max(origin.status) == NAN
        and any(_stat(s) != FINITE for s in origin.ins)
    ):
        pd = _poison_details(origin)
        f.form = pd["form"]
        f.explanation = (
            f"`{origin.prim}` computed {pd['text'] or 'a NaN'} from infinite inputs that came from "
            "constants (such as a -inf mask). Make sure no row or reduction sees only masked "
            "values, or mask the result instead of the input."
        )
    elif entry_id is None:
        f.explanation = (
            f"`{origin.prim}` produced {result} from finite inputs. It is not in gradsan's "
            "catalog of singular operations; look at its operand values at the index shown."
        )
    return f


def _overflow_hit(origin: Node):
    try:
        from .._catalog._overflow import classify_overflow
    except ImportError:
        return None
    if not origin.outs or origin.operands is None:
        return None
    op = "add" if origin.prim == "add_any" else origin.prim  # canonical op for the float32 check
    return classify_overflow(op, origin.operands, origin.outs[0])


# -- the transformation -------------------------------------------------------------------------


def diagnose(
    fun: Callable,
    args: tuple,
    kwargs: dict,
    *,
    who: str = "explain",
    outputs: Any = None,
    run_outputs: bool = True,
    trace_fun: Callable | None = None,
) -> Report:
    """Interpret ``fun(*args, **kwargs)`` and blame every non-finite output.

    ``trace_fun`` computes the same outputs and is what gets traced (guard passes its already
    compiled twin, whose trace jax has cached).
    """
    call = flatten_call(fun, args, kwargs, trace_fun)
    labels, leaves = arg_labels(fun, call.dyn_args, call.dyn_kwargs)
    check_args(leaves, labels, who)
    flat_args = call.flat

    try:
        closed, out_shape = jax.make_jaxpr(call.fun, return_shape=True)(*flat_args)
    except TypeError as e:
        msg = str(e)
        if "grad requires real" in msg or "integer" in msg.lower() and "grad" in msg.lower():
            raise UsageError(
                f"gradsan.jax.{who}: {msg.splitlines()[0]} Differentiate with respect to float "
                "arrays: pass jnp.asarray(x, jnp.float32) instead of an integer."
            ) from e
        if "scalar-output" in msg:
            raise UsageError(
                f"gradsan.jax.{who}: {msg.splitlines()[0]} Reduce the loss to a scalar first "
                "(jax.grad(lambda p: jnp.mean(loss(p)))), or use jax.jacrev for a Jacobian."
            ) from e
        raise
    interp = Interpreter()
    outs, out_srcs = interp.run_closed(closed, flat_args, labels)
    out_labels = output_labels(fun, out_shape, args, labels)
    if outputs is None and run_outputs:
        outputs = fun(*args, **kwargs)
    report = Report(outputs=outputs, function=getattr(fun, "__name__", "function"), backend="jax")
    blame = Blame()
    groups: dict[int, tuple[Node, Node | None, list[OutputHit]]] = {}
    order: list[int] = []
    for val, src, (label, kind) in zip(outs, out_srcs, out_labels):
        if src is None or _stat(src) == FINITE:
            continue
        a = np.asarray(val)
        if a.dtype.kind not in "fc":
            a = a.astype(np.float32)
        nan = int(np.isnan(a).sum())
        inf = int(np.isinf(a).sum())
        hit = OutputHit(label, nan + inf, int(a.size), nan, inf, kind)
        for origin, poison in blame.origins(src):
            # the same equation in many loop iterations is one finding, at its first iteration
            key = id(origin.eqn) if origin.eqn is not None else id(origin)
            if key not in groups:
                groups[key] = (origin, poison, [])
                order.append(key)
            elif origin.seq < groups[key][0].seq:
                groups[key] = (origin, poison or groups[key][1], groups[key][2])
            if hit not in groups[key][2]:
                groups[key][2].append(hit)
    order.sort(key=lambda k: groups[k][0].seq)
    merged: dict[tuple, Finding] = {}
    for key in order:
        origin, poison, hits = groups[key]
        f = _origin_finding(interp, origin, poison, hits)
        w = f.where
        same = (
            f.kind,
            f.catalog_id,
            f.primitive,
            f.phase,
            (w.file, w.line, w.column) if w is not None else None,
            f.detail.get("input"),
        )
        if same in merged:  # one forward op, several derivative equations (atan2's dx and dy)
            have = merged[same]
            have.outputs += [h for h in f.outputs if h not in have.outputs]
            continue
        merged[same] = f
        report.findings.append(f)
    return report


def explain(fun: Callable) -> Callable[..., Report]:
    """Wrap ``fun`` so that calling it returns a :class:`gradsan.Report` on its outputs.

    ``fun`` is anything JAX can trace: ``jax.grad(loss)``, ``jax.value_and_grad(loss)``, a
    jitted train step. The program is interpreted equation by equation; every non-finite output
    is followed back along the dataflow to the operation where the NaN or Inf was born, and to
    the place where an inf met the zero that made it a NaN.

    Example::

        report = gradsan.jax.explain(jax.grad(loss))(theta)
        print(report)            # origin, where it met a zero, why, and a fix
        report.outputs           # what jax.grad(loss)(theta) returned
    """
    check_callable(fun, "explain")

    @functools.wraps(fun)
    def explained(*args: Any, **kwargs: Any) -> Report:
        return diagnose(fun, args, kwargs, who="explain")

    return explained
