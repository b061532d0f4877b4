"""Typed rewriters: a catalog fix written on the syntax tree of the user's statement.

Each rewriter reads the expression under the caret by role (a call's positional and keyword
arguments, a method call's receiver, an operator's operands), checks that the fix applies there
(a root is folded into an exponent only when its argument is a power; ``log_softmax`` only when
the log's argument is a softmax; a safe twin only when the user's own call is the operation the
twin replaces and the twin accepts its arguments) and returns the new text of one expression of
the statement. Nothing here guesses: a fix that cannot be built returns None.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from collections.abc import Callable

from ._site import Site

# the functions each backend's users call, by canonical name
_JAX = {
    "jax.numpy.sqrt": "sqrt",
    "jax.lax.sqrt": "sqrt",
    "jax.lax.rsqrt": "rsqrt",
    "jax.numpy.cbrt": "cbrt",
    "jax.lax.cbrt": "cbrt",
    "jax.numpy.log": "log",
    "jax.lax.log": "log",
    "jax.numpy.log2": "log2",
    "jax.numpy.log10": "log10",
    "jax.numpy.log1p": "log1p",
    "jax.lax.log1p": "log1p",
    "jax.numpy.arccos": "arccos",
    "jax.numpy.acos": "arccos",
    "jax.lax.acos": "arccos",
    "jax.numpy.arcsin": "arcsin",
    "jax.numpy.asin": "arcsin",
    "jax.lax.asin": "arcsin",
    "jax.numpy.arctanh": "arctanh",
    "jax.numpy.atanh": "arctanh",
    "jax.lax.atanh": "arctanh",
    "jax.numpy.arctan2": "atan2",
    "jax.numpy.atan2": "atan2",
    "jax.lax.atan2": "atan2",
    "jax.numpy.hypot": "hypot",
    "jax.numpy.abs": "abs",
    "jax.numpy.absolute": "abs",
    "jax.lax.abs": "abs",
    "builtins.abs": "abs",
    "jax.numpy.maximum": "maximum",
    "jax.numpy.minimum": "minimum",
    "jax.numpy.clip": "clip",
    "jax.numpy.linalg.norm": "norm",
    "jax.numpy.std": "std",
    "jax.numpy.var": "var",
    "jax.scipy.special.xlogy": "xlogy",
    "jax.numpy.power": "pow",
    "jax.numpy.pow": "pow",
    "jax.lax.pow": "pow",
    "jax.numpy.divide": "div",
    "jax.numpy.true_divide": "div",
    "jax.lax.div": "div",
    "jax.nn.logsumexp": "logsumexp",
    "jax.scipy.special.logsumexp": "logsumexp",
    "jax.nn.softmax": "softmax",
    "jax.nn.log_softmax": "log_softmax",
    "jax.nn.sigmoid": "sigmoid",
    "jax.nn.relu": "relu",
    "jax.numpy.sinc": "sinc",
    "jax.numpy.exp": "exp",
    "jax.lax.exp": "exp",
    "jax.numpy.where": "where",
}
_TORCH = {
    "torch.sqrt": "sqrt",
    "torch.rsqrt": "rsqrt",
    "torch.log": "log",
    "torch.log2": "log2",
    "torch.log10": "log10",
    "torch.log1p": "log1p",
    "torch.acos": "arccos",
    "torch.arccos": "arccos",
    "torch.asin": "arcsin",
    "torch.arcsin": "arcsin",
    "torch.atanh": "arctanh",
    "torch.arctanh": "arctanh",
    "torch.atan2": "atan2",
    "torch.arctan2": "atan2",
    "torch.hypot": "hypot",
    "torch.abs": "abs",
    "torch.absolute": "abs",
    "builtins.abs": "abs",
    "torch.maximum": "maximum",
    "torch.minimum": "minimum",
    "torch.clamp": "clip",
    "torch.clip": "clip",
    "torch.norm": "norm",
    "torch.linalg.norm": "norm",
    "torch.linalg.vector_norm": "vector_norm",
    "torch.std": "std",
    "torch.var": "var",
    "torch.xlogy": "xlogy",
    "torch.special.xlogy": "xlogy",
    "torch.pow": "pow",
    "torch.div": "div",
    "torch.divide": "div",
    "torch.true_divide": "div",
    "torch.logsumexp": "logsumexp",
    "torch.softmax": "softmax",
    "torch.nn.functional.softmax": "softmax",
    "torch.log_softmax": "log_softmax",
    "torch.nn.functional.log_softmax": "log_softmax",
    "torch.sigmoid": "sigmoid",
    "torch.nn.functional.sigmoid": "sigmoid",
    "torch.relu": "relu",
    "torch.nn.functional.relu": "relu",
    "torch.sinc": "sinc",
    "torch.exp": "exp",
    "torch.where": "where",
}
# tensor methods, by name
_METHODS = {
    **{k: k for k in ("sqrt", "rsqrt", "log", "log2", "log10", "log1p", "abs", "exp")},
    **{k: k for k in ("norm", "std", "var", "pow", "div", "logsumexp", "softmax", "sigmoid")},
    **{k: k for k in ("relu", "xlogy", "hypot", "maximum", "minimum", "sinc", "log_softmax")},
    "acos": "arccos",
    "arccos": "arccos",
    "asin": "arcsin",
    "arcsin": "arcsin",
    "atanh": "arctanh",
    "arctanh": "arctanh",
    "atan2": "atan2",
    "arctan2": "atan2",
    "clamp": "clip",
    "clip": "clip",
}
_UNARY = {"sqrt", "rsqrt", "cbrt", "log", "log2", "log10", "log1p", "arccos", "arcsin"}
_UNARY |= {"arctanh", "abs", "sinc", "exp", "sigmoid", "relu"}
_BINARY = {"atan2", "hypot", "maximum", "minimum", "xlogy", "pow", "div"}
_LN = {"log2": "0.6931471805599453", "log10": "2.302585092994046"}  # ln 2, ln 10


@dataclasses.dataclass
class Call:
    """The expression under the caret by role: canonical op, data operands, keyword args."""

    canon: str
    operands: list[ast.expr]
    keywords: dict[str, ast.expr]
    func: ast.expr | None  # the called function (None for an operator)
    method: bool = False


def read_call(site: Site, node: ast.expr, backend: str) -> Call | None:
    """The call (or operator) ``node`` is, by role; None when it is neither."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Pow)):
        canon = "div" if isinstance(node.op, ast.Div) else "pow"
        return Call(canon, [node.left, node.right], {}, None)
    if not isinstance(node, ast.Call):
        return None
    if any(isinstance(a, ast.Starred) for a in node.args) or any(
        k.arg is None for k in node.keywords
    ):
        return None
    kws = {k.arg: k.value for k in node.keywords if k.arg is not None}
    table = _TORCH if backend == "torch" else _JAX
    q = site.qualname(node.func)
    if q is not None and q in table:
        return Call(table[q], list(node.args), kws, node.func)
    if q is None and isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS:
        recv = node.func.value
        if isinstance(recv, ast.Name) and recv.id in ("self", "cls"):
            return None
        if isinstance(recv, ast.Name) and recv.id in site.aliases:
            return None  # a module's function this table does not know
        return Call(_METHODS[node.func.attr], [recv, *node.args], kws, node.func, method=True)
    return None


def _safe_module(backend: str):  # type: ignore[no-untyped-def]
    if backend == "torch":
        from ..torch import safe

        return safe
    from ..jax import safe as jsafe

    return jsafe


@functools.cache
def _signature(backend: str, name: str) -> inspect.Signature | None:
    fn = getattr(_safe_module(backend), name, None)
    if fn is None:
        return None
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _accepts(backend: str, name: str, npos: int, kws: list[str]) -> bool:
    sig = _signature(backend, name)
    if sig is None:
        return False
    try:
        sig.bind(*range(npos), **dict.fromkeys(kws, 0))
    except TypeError:
        return False
    return True


def _wrap(site: Site, node: ast.expr) -> str:
    """The operand's text, parenthesised if it is not atomic."""
    text = site.segment(node)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)):
        return text
    return f"({text})"


def _simple(node: ast.expr) -> bool:
    """A name, attribute or constant-indexed subscript: cheap to write twice."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _simple(node.value)
    if isinstance(node, ast.Subscript):
        return _simple(node.value) and all(
            isinstance(n, (ast.Constant, ast.Slice, ast.UnaryOp, ast.Tuple, ast.Name))
            for n in ast.walk(node.slice)
            if not isinstance(n, (ast.Load, ast.USub, ast.expr_context))
        )
    return False


# ---- keyword arguments, per canonical op --------------------------------------------------------

# positional parameters after the data operands, by backend and canonical op (the library's order)
_POSITIONAL = {
    ("jax", "norm"): ("ord", "axis", "keepdims"),
    ("jax", "std"): ("axis",),
    ("jax", "var"): ("axis",),
    ("jax", "logsumexp"): ("axis",),
    ("jax", "softmax"): ("axis",),
    ("jax", "clip"): ("min", "max"),
    ("torch", "norm"): ("ord", "axis", "keepdims"),
    ("torch", "vector_norm"): ("ord", "axis", "keepdims"),
    ("torch", "std"): ("axis",),
    ("torch", "var"): ("axis",),
    ("torch", "logsumexp"): ("axis", "keepdims"),
    ("torch", "softmax"): ("axis",),
    ("torch", "clip"): ("min", "max"),
}
_RENAME = {
    "dim": "axis",
    "keepdim": "keepdims",
    "a_min": "min",
    "a_max": "max",
    "input": None,  # torch's name of the data operand: positional only here
}


def safe_args(site: Site, call: Call, backend: str, nd: int) -> tuple[list[str], list[str]] | None:
    """(positional texts, keyword texts ``name=value``) of the safe twin's call, with the user's
    keyword arguments kept under the twin's names; None when one cannot be carried over."""
    if len(call.operands) < nd:
        return None
    pos = [site.segment(a) for a in call.operands[:nd]]
    kw: dict[str, str] = {}
    names = _POSITIONAL.get((backend, call.canon), ())
    extra = call.operands[nd:]
    if len(extra) > len(names):
        return None
    for name, a in zip(names, extra):
        kw[name] = site.segment(a)
    for k, v in call.keywords.items():
        if k == "p" and call.canon in ("norm", "vector_norm"):
            k = "ord"
        elif k in _RENAME:
            rk = _RENAME[k]
            if rk is None:
                return None
            k = rk
        if k in kw:
            return None
        kw[k] = site.segment(v)
    if call.canon in ("std", "var") and backend == "torch":
        # torch's default is the unbiased estimate (correction=1): say so in the twin's ddof
        if "unbiased" in kw:
            u = kw.pop("unbiased")
            if u not in ("True", "False"):
                return None
            kw["ddof"] = "1" if u == "True" else "0"
        if "correction" in kw:
            kw["ddof"] = kw.pop("correction")
        kw.setdefault("ddof", "1")
    if call.canon in ("std", "var") and backend == "jax" and "correction" in kw:
        kw["ddof"] = kw.pop("correction")
    if call.canon == "norm" and backend == "torch" and kw.get("ord") in ("'fro'", '"fro"'):
        if "axis" not in kw:
            kw.pop("ord")  # the Frobenius norm of all elements: the default
    if call.canon == "vector_norm":
        if "axis" not in kw and kw.get("ord", "2") not in ("2", "2.0"):
            return None  # a vector norm of the flattened tensor: the twin's ord would differ
        if "axis" not in kw:
            kw.pop("ord", None)
    return pos, [f"{k}={v}" for k, v in kw.items()]


# ---- the rewriters ------------------------------------------------------------------------------


@dataclasses.dataclass
class Rewrite:
    target: ast.expr  # the expression whose text is replaced
    text: str  # its new text
    value_note: str | None = None  # a stated change of the forward value
    uses_gradsan: bool = False


def _safe_name(site: Site, backend: str) -> tuple[str, bool]:
    """The name of the safe module in this file (``safe`` after ``from gradsan.jax import
    safe``), and whether it needs ``import gradsan.<backend>``."""
    mod = f"gradsan.{backend}.safe"
    for name, path in site.aliases.items():
        if path == mod:
            return name, False
    return mod, True


def rewrite_safe(site: Site, backend: str, twin: str, entry_op: str) -> Rewrite | None:
    """The user's call rewritten to the safe twin ``twin`` with the same arguments."""
    call = read_call(site, site.node, backend)
    if call is None:
        return None
    canon = call.canon
    sname, need = _safe_name(site, backend)
    if canon in _LN and twin == "log":
        if len(call.operands) != 1 or call.keywords:
            return None
        x = site.segment(call.operands[0])
        return Rewrite(site.node, f"{sname}.log({x}) / {_LN[canon]}", uses_gradsan=need)
    if canon == "relu" and twin == "maximum":
        if len(call.operands) != 1 or call.keywords:
            return None
        return Rewrite(
            site.node, f"{sname}.maximum({site.segment(call.operands[0])}, 0.0)", uses_gradsan=need
        )
    want = {twin}
    if twin == "div" and entry_op == "integer_pow":
        want = {"pow"}
    if canon == "vector_norm" and twin == "norm":
        canon = "norm"
    if canon not in want or _signature(backend, twin) is None:
        return None
    nd = 2 if canon in _BINARY else 1
    if canon in _UNARY and (len(call.operands) != 1 or call.keywords):
        return None
    if canon in _BINARY and (len(call.operands) != 2 or call.keywords):
        return None
    got = safe_args(site, call, backend, nd)
    if got is None:
        return None
    pos, kws = got
    if not _accepts(backend, twin, len(pos), [k.split("=", 1)[0] for k in kws]):
        return None
    return Rewrite(site.node, f"{sname}.{twin}({', '.join(pos + kws)})", uses_gradsan=need)


def _array_module(site: Site, backend: str) -> str | None:
    return site.alias_for("torch" if backend == "torch" else "jax.numpy")


def _replace_in(site: Site, outer: ast.expr, inner: ast.expr, text: str) -> str:
    """``outer``'s text with ``inner``'s span replaced by ``text`` (both on the same source)."""
    from ._edit import offsets

    o0, o1 = offsets(site, outer)
    i0, i1 = offsets(site, inner)
    full = site.source
    return full[o0:i0] + text + full[i1:o1]


def rewrite_double_where(site: Site, backend: str, fill: str = "1.0") -> Rewrite | None:
    """``where(x > 0, op(where(x > 0, x, 1.0)), 0.0)`` for a unary op (or a power's base)."""
    call = read_call(site, site.node, backend)
    np_ = _array_module(site, backend)
    if call is None or np_ is None or not call.operands or call.keywords:
        return None
    if call.canon not in ("sqrt", "pow", "cbrt", "rsqrt"):
        return None
    x = call.operands[0]
    if not _simple(x) or (call.canon != "pow" and len(call.operands) != 1):
        return None
    xs = site.segment(x)
    inner = f"{np_}.where({xs} > 0, {xs}, {fill})"
    body = _replace_in(site, site.node, x, inner)
    return Rewrite(site.node, f"{np_}.where({xs} > 0, {body}, 0.0)")


def rewrite_clamp_safe(site: Site, backend: str) -> Rewrite | None:
    """``safe.sqrt(maximum(x, 0))``: a rounding below 0 taken as 0 (the value changes there)."""
    call = read_call(site, site.node, backend)
    np_ = _array_module(site, backend)
    if call is None or np_ is None or call.canon != "sqrt" or len(call.operands) != 1:
        return None
    if call.keywords:
        return None
    xs = site.segment(call.operands[0])
    clamp = f"{np_}.clamp({xs}, min=0.0)" if backend == "torch" else f"{np_}.maximum({xs}, 0.0)"
    sname, need = _safe_name(site, backend)
    return Rewrite(
        site.node,
        f"{sname}.sqrt({clamp})",
        value_note="the value where the argument was negative becomes 0 instead of NaN",
        uses_gradsan=need,
    )


def rewrite_fold_pow(site: Site, backend: str) -> Rewrite | None:
    """``sqrt(a ** p)`` -> ``a ** (p / 2)``, only when the root's argument is a power."""
    call = read_call(site, site.node, backend)
    if call is None or call.canon != "sqrt" or len(call.operands) != 1 or call.keywords:
        return None
    arg = call.operands[0]
    inner = read_call(site, arg, backend)
    if inner is None or inner.canon != "pow" or len(inner.operands) != 2 or inner.keywords:
        return None
    a, p = inner.operands
    return Rewrite(site.node, f"{_wrap(site, a)} ** ({site.segment(p)} / 2)")


def rewrite_log_prob(site: Site, backend: str) -> Rewrite | None:
    """``log(softmax(z))`` -> ``log_softmax(z)`` and ``log(sigmoid(z))`` -> ``log_sigmoid(z)``,
    only when the log's argument is that call."""
    call = read_call(site, site.node, backend)
    if call is None or call.canon != "log" or len(call.operands) != 1 or call.keywords:
        return None
    arg = call.operands[0]
    inner = read_call(site, arg, backend)
    if not isinstance(arg, ast.Call) or inner is None or inner.canon not in ("softmax", "sigmoid"):
        return None
    func = arg.func
    assert func is not None
    if inner.canon == "softmax":
        if isinstance(func, ast.Attribute):
            new_func = site.segment(func.value) + ".log_softmax"
        elif isinstance(func, ast.Name):
            if "log_softmax" not in site.names_in_scope():
                return None
            new_func = "log_softmax"
        else:
            return None
        args = ", ".join(
            [site.segment(a) for a in arg.args]
            + [f"{k.arg}={site.segment(k.value)}" for k in arg.keywords if k.arg]
        )
        if inner.method:  # z.softmax(dim).log() -> z.log_softmax(dim)
            return Rewrite(site.node, f"{new_func}({args})")
        return Rewrite(site.node, f"{new_func}({args})")
    if arg.keywords or len(arg.args) != 1:
        return None
    z = site.segment(inner.operands[0])
    if backend == "torch":
        mod = site.alias_for("torch.nn.functional")
        return Rewrite(site.node, f"{mod}.logsigmoid({z})") if mod else None
    mod = site.alias_for("jax.nn")
    return Rewrite(site.node, f"{mod}.log_sigmoid({z})") if mod else None


# ---- rewrites found from the statement's shape, not from one catalog fix -------------------------


def rewrite_where_guard(site: Site, backend: str) -> tuple[str, Rewrite] | None:
    """The op under the caret sits in a branch of ``where(c, a, b)``: guard its argument with the
    same condition (the double-where trick), so the unselected branch stays finite."""
    call = read_call(site, site.node, backend)
    if call is None or not call.operands:
        return None
    child: ast.AST = site.node
    n = site.parent(site.node)
    while n is not None and not isinstance(n, ast.stmt):
        if isinstance(n, ast.Call):
            w = read_call(site, n, backend)
            if w is not None and w.canon == "where" and len(n.args) == 3 and not n.keywords:
                cond, a, b = n.args
                if child is a or child is b:
                    # the operand that is singular: a quotient's denominator, xlogy's log
                    # argument (xlogy(x, 0) = -inf for x != 0), else the first
                    x = call.operands[1] if call.canon in ("div", "xlogy") else call.operands[0]
                    xs, cs = site.segment(x), site.segment(cond)
                    fill = "1.0"
                    guard = f"{site.segment(n.func)}({cs}, {xs}, {fill})"
                    if child is b:
                        guard = f"{site.segment(n.func)}({cs}, {fill}, {xs})"
                    text = _replace_in(site, site.node, x, guard)
                    return (
                        "The NaN comes from the branch the where does not select: guard the "
                        "operand with the same condition (the double-where trick):",
                        Rewrite(site.node, text),
                    )
        child = n
        n = site.parent(n)
    return None


def _where_call(site: Site, backend: str) -> ast.Call | None:
    """The ``where(c, a, b)`` call of the site's statement (the one under the caret first)."""
    nodes = [site.node, *ast.walk(site.stmt)]
    for n in nodes:
        if isinstance(n, ast.Call) and len(n.args) == 3 and not n.keywords:
            w = read_call(site, n, backend)
            if w is not None and w.canon == "where":
                return n
    return None


def _defined_before(site: Site, cond: ast.expr, before: ast.stmt) -> str:
    """``cond``'s text, with each name that the function assigns (``name = value``) only after
    the statement ``before`` replaced by ``(value)``, so the text can move up to ``before``."""
    text = site.segment(cond)
    later: dict[str, ast.expr] = {}
    for n in ast.walk(site.tree):
        if (
            isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and before.lineno < n.lineno <= site.stmt.lineno
        ):
            later[n.targets[0].id] = n.value
    if not later:
        return text
    base = cond.col_offset if cond.lineno == cond.end_lineno else None
    spans = sorted(
        (n.col_offset, n.end_col_offset or 0, n.id)
        for n in ast.walk(cond)
        if isinstance(n, ast.Name) and n.id in later and n.lineno == cond.lineno
    )
    if base is None:
        return text
    out, at = [], 0
    for c0, c1, name in spans:
        out.append(text[at : c0 - base] + f"({site.segment(later[name])})")
        at = c1 - base
    return "".join(out) + text[at:]


def rewrite_where_from(site: Site, where: Site, backend: str) -> Rewrite | None:
    """The op under the caret is assigned to a name that a ``where`` on another statement (the
    zero's source) does not select: guard the op's operand with that where's condition, so the
    unselected branch stays finite (the double-where trick across two statements)."""
    call = read_call(site, site.node, backend)
    if call is None or not call.operands or site.file != where.file or site.stmt is where.stmt:
        return None
    st = site.stmt
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
        return None
    target = st.targets[0]
    if not isinstance(target, ast.Name):
        return None
    w = _where_call(where, backend)
    if w is None:
        return None
    cond, a, b = w.args
    x = call.operands[1] if call.canon in ("div", "xlogy") else call.operands[0]
    fill = "0.0" if call.canon == "log1p" else "1.0"
    cs, xs, fn = _defined_before(where, cond, st), site.segment(x), where.segment(w.func)
    if isinstance(a, ast.Name) and a.id == target.id:
        guard = f"{fn}({cs}, {xs}, {fill})"
    elif isinstance(b, ast.Name) and b.id == target.id:
        guard = f"{fn}({cs}, {fill}, {xs})"
    else:
        return None
    return Rewrite(site.node, _replace_in(site, site.node, x, guard))


def rewrite_exp_log(site: Site, backend: str) -> tuple[str, Rewrite] | None:
    """``exp(p * log(a))`` around the log under the caret: the power ``a ** p``, written with the
    safe pow (finite at a == 0)."""
    call = read_call(site, site.node, backend)
    if call is None or call.canon != "log" or len(call.operands) != 1 or call.keywords:
        return None
    mul = site.parent(site.node)
    if not isinstance(mul, ast.BinOp) or not isinstance(mul.op, ast.Mult):
        return None
    exp = site.parent(mul)
    if not isinstance(exp, ast.expr):
        return None
    ecall = read_call(site, exp, backend)
    if ecall is None or ecall.canon != "exp" or ecall.operands != [mul]:
        return None
    p = mul.left if mul.right is site.node else mul.right
    a = site.segment(call.operands[0])
    sname, need = _safe_name(site, backend)
    return (
        "exp(p * log(a)) is the power a ** p; write it as one (gradsan's safe pow is finite at "
        "a == 0):",
        Rewrite(exp, f"{sname}.pow({a}, {site.segment(p)})", uses_gradsan=need),
    )


def rewrite_exp_log_entry(site: Site, backend: str) -> Rewrite | None:
    """The exp-log-at-zero entry's fix: :func:`rewrite_exp_log`'s rewrite."""
    got = rewrite_exp_log(site, backend)
    return got[1] if got is not None else None


REWRITERS: dict[str, Callable[..., Rewrite | None]] = {
    "exp_log": rewrite_exp_log_entry,
    "double_where": rewrite_double_where,
    "clamp_safe": rewrite_clamp_safe,
    "fold_pow": rewrite_fold_pow,
    "log_prob": rewrite_log_prob,
}
