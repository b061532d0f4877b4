"""PyTorch library functions that return a convention silently, read with the catalog's masks.

``torch.linalg.norm`` / ``vector_norm`` / ``Tensor.norm`` at 0, ``torch.pdist`` / ``cdist``
between identical points (PyTorch returns the subgradient 0 where JAX gets NaN), ``std`` of a
constant, an inf-norm with tied maxima, ``quantile`` / ``median`` with the selected order
statistic tied, ``eigvalsh`` / ``eigh`` with a repeated eigenvalue, ``F.normalize`` with
``p=1`` at zero entries (or any ``p`` at a zero vector), ``det`` of a singular matrix. Each is
mapped onto the catalog op whose mask decides it (norm, std, max, sort, eigh, abs, det), and
PyTorch's own gradient at the first hit is measured and compared with the entry's admissible
set, as JAX's is.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import numpy as np
import torch

from .._catalog import _classify

# torch function name -> the library operation read here
LIBRARY_FUNCS: dict[str, str] = {
    "norm": "norm",
    "linalg_norm": "norm",
    "linalg_vector_norm": "norm",
    "vector_norm": "norm",
    "pdist": "pdist",
    "cdist": "cdist",
    "std": "std",
    "quantile": "quantile",
    "nanquantile": "quantile",
    "median": "median",
    "nanmedian": "median",
    "linalg_eigvalsh": "eigh",
    "linalg_eigh": "eigh",
    "normalize": "normalize",
    "linalg_det": "det",
    "det": "det",
}


def display_name(name: str) -> str:
    """The library function as a user writes it."""
    if name == "normalize":
        return "torch.nn.functional.normalize"
    if name.startswith("linalg_"):
        return "torch.linalg." + name[len("linalg_") :]
    return "torch." + name


@dataclasses.dataclass
class LibraryHit:
    entry_id: str
    op: str  # the catalog op
    mask: np.ndarray
    got: str
    facts: dict
    admissible: bool | None


def _np(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()
        return t.cpu().numpy()
    return np.asarray(t)


def _arg(args: list, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


def _dims(d: Any) -> Any:
    if d is None:
        return None
    if isinstance(d, int):
        return (d,)
    return tuple(int(a) for a in d)


def _fmt(v: Any) -> str:
    a = np.asarray(v, np.float64)
    if a.ndim == 0:
        return f"{float(a):.6g}"
    return "[" + ", ".join(f"{float(u):.6g}" for u in a.ravel()[:8]) + "]"


def _norm_ord(name: str, args: list, kwargs: dict) -> tuple[Any, Any]:
    """(ord, dims) of a norm call."""
    if name == "norm":  # torch.norm(input, p='fro', dim=None) / Tensor.norm
        return _arg(args, kwargs, 1, "p", 2), _dims(_arg(args, kwargs, 2, "dim"))
    return _arg(args, kwargs, 1, "ord", None), _dims(_arg(args, kwargs, 2, "dim"))


def hit(name: str, args: tuple, kwargs: dict, out: Any) -> LibraryHit | None:
    """The convention a library call sat on, or None."""
    kind = LIBRARY_FUNCS.get(name)
    a = list(args)
    x = a[0] if a else kwargs.get("input")
    if kind is None or not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        return None
    xn = _np(x).astype(np.float64)
    if xn.size == 0:
        return None
    if kind == "norm":
        p, dims = _norm_ord(name, a, kwargs)
        if isinstance(p, str):
            p = 2 if p == "fro" else p
        if p is None:
            p = 2
        return _pnorm(float(p), x, xn, dims, lambda t: _call_norm(name, a, kwargs, t))
    if kind == "normalize":
        p = float(_arg(a, kwargs, 1, "p", 2.0))
        dim = int(_arg(a, kwargs, 2, "dim", 1))
        return _pnorm(p, x, xn, (dim,), lambda t: torch.linalg.vector_norm(t, ord=p, dim=dim))
    if kind in ("pdist", "cdist"):
        return _dist(kind, a, kwargs, x, xn)
    if kind == "std":
        dims = _dims(_arg(a, kwargs, 1, "dim"))
        correction = kwargs.get("correction", 1 if kwargs.get("unbiased", True) else 0)
        params = {"axes": dims, "correction": correction, "ddof": correction}
        h = _classify.classify("std", [xn], None, params)
        if h is None or h.entry_id != "std-of-constant":
            return None
        g = _grad_at(lambda t: torch.std(t, dim=dims, correction=correction), x, h.mask)
        n = xn.size if dims is None else math.prod(xn.shape[d] for d in dims)
        ok = None if g is None else bool(abs(g.sum()) <= 1e-5 and _l2(g) <= 1 / _sq(n - correction))
        return LibraryHit(h.entry_id, "std", np.asarray(h.mask, bool), h.got, _value(g), ok)
    if kind in ("quantile", "median"):
        return _order_stat(kind, name, a, kwargs, x, xn)
    if kind == "eigh":
        h = _classify.classify("eigh", [xn], None, {})
        if h is None:
            return None
        return LibraryHit(
            h.entry_id, "eigh", np.asarray(h.mask, bool), h.got, {"value": "finite"}, True
        )
    if kind == "det":
        h = _classify.classify("det", [xn], None, {})
        if h is None:
            return None
        g = _grad_at(torch.linalg.det, x, np.ones((), bool))
        return LibraryHit(h.entry_id, "det", np.asarray(h.mask, bool), h.got, _value(g), False)
    return None


def _sq(v: float) -> float:
    return math.sqrt(max(v, 1e-300))


def _l2(g: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.asarray(g, np.float64) ** 2)))


def _value(g: np.ndarray | None) -> dict:
    return {} if g is None else {"value": _fmt(g)}


def _call_norm(name: str, args: list, kwargs: dict, t: torch.Tensor) -> torch.Tensor:
    rest = list(args[1:])
    if name == "norm":
        return torch.norm(t, *rest, **kwargs)
    fn = torch.linalg.norm if name == "linalg_norm" else torch.linalg.vector_norm
    return fn(t, *rest, **kwargs)


def _grad_at(fn: Any, x: torch.Tensor, mask: np.ndarray) -> np.ndarray | None:
    """PyTorch's gradient of ``fn`` at ``x`` for the first hit output element (float64)."""
    try:
        with torch.enable_grad():
            t = x.detach().clone().requires_grad_(True)
            out = fn(t)
            if isinstance(out, tuple):
                out = out[0]
            m = np.asarray(mask, bool)
            idx = np.argwhere(m)
            flat = out.reshape(-1)
            j = 0
            if out.dim() > 0 and len(idx) and m.shape == tuple(out.shape):
                j = int(np.ravel_multi_index(tuple(idx[0]), m.shape))
            (g,) = inspect.unwrap(torch.autograd.grad)(flat[j], t, allow_unused=True)
        return None if g is None else _np(g).astype(np.float64)
    except (RuntimeError, TypeError, ValueError):
        return None


def _pnorm(p: float, x: torch.Tensor, xn: np.ndarray, dims: Any, fn: Any) -> LibraryHit | None:
    params = {"axes": dims} if dims is not None else {}
    if p == 2:
        h = _classify.classify("norm", [xn], None, params)
        if h is None:
            return None
        g = _grad_at(fn, x, h.mask)
        ok = None if g is None else bool(_l2(g) <= 1 + 1e-6)
        return LibraryHit(h.entry_id, "norm", np.asarray(h.mask, bool), h.got, _value(g), ok)
    if p == 1:
        h = _classify.classify("abs", [xn], None, {})
        if h is None:
            return None
        g = _grad_at(fn, x, np.ones((), bool))
        zero = xn == 0
        ok = None if g is None else bool(np.all(np.abs(g[zero]) <= 1 + 1e-6))
        return LibraryHit(h.entry_id, "abs", np.asarray(h.mask, bool), h.got, _value(g), ok)
    if math.isinf(p):
        h = _classify.classify("reduce_min" if p < 0 else "reduce_max", [np.abs(xn)], None, params)
        if h is None:
            return None
        g = _grad_at(fn, x, h.mask)
        ok = None
        if g is not None:
            ax = m_axes(xn, dims)
            ext = (np.min if p < 0 else np.max)(np.abs(xn), axis=ax, keepdims=True)
            tied = np.abs(xn) == ext
            w = g * np.sign(xn)
            ok = bool(np.all(np.abs(g[~tied]) <= 1e-6) and np.all(w[tied] >= -1e-6))
        return LibraryHit(h.entry_id, "max", np.asarray(h.mask, bool), h.got, _value(g), ok)
    return None


def m_axes(x: np.ndarray, dims: Any) -> tuple:
    return tuple(range(x.ndim)) if dims is None else tuple(d % x.ndim for d in dims)


def _dist(kind: str, args: list, kwargs: dict, x: torch.Tensor, xn: np.ndarray):
    p = float(_arg(args, kwargs, 1 if kind == "pdist" else 2, "p", 2.0))
    if kind == "pdist":
        n = xn.shape[0]
        i, j = np.triu_indices(n, 1)
        diff = xn[i] - xn[j]
        fn = lambda t: torch.pdist(t, p=p)  # noqa: E731
    else:
        y = args[1] if len(args) > 1 else kwargs.get("x2")
        if not isinstance(y, torch.Tensor):
            return None
        yn = _np(y).astype(np.float64)
        diff = xn[..., :, None, :] - yn[..., None, :, :]
        fn = lambda t: torch.cdist(t, y.detach(), p=p)  # noqa: E731
    if p != 2 and p != 1:
        return None
    h = _classify.classify("norm" if p == 2 else "abs", [diff], None, {"axes": (-1,)})
    if h is None:
        return None
    mask = np.asarray(h.mask, bool)
    if p == 1:
        mask = np.asarray(mask.any(-1), bool)
    g = _grad_at(fn, x, mask)
    ok = None if g is None else bool(np.all(np.abs(g) <= 1 + 1e-6))
    return LibraryHit("norm-at-zero" if p == 2 else h.entry_id, "norm", mask, h.got, _value(g), ok)


def _order_stat(kind: str, name: str, args: list, kwargs: dict, x: torch.Tensor, xn: np.ndarray):
    """quantile / median: a tie only where a selected order statistic equals another element."""
    if kind == "median":
        dim = _arg(args, kwargs, 1, "dim")
        q = None
    else:
        q = _arg(args, kwargs, 1, "q")
        dim = _arg(args, kwargs, 2, "dim")
        if isinstance(q, torch.Tensor):
            q = _np(q)
        q = np.atleast_1d(np.asarray(q, np.float64))
    xm = xn.reshape(-1, 1) if dim is None else np.moveaxis(xn, int(dim), -1)
    if dim is None:
        xm = xn.reshape(1, -1)
    n = xm.shape[-1]
    srt = np.sort(xm, axis=-1)
    if kind == "median":
        picks = [[(n - 1) // 2]]
    else:
        pos = q * (n - 1)
        picks = [sorted({int(math.floor(v)), int(math.ceil(v))}) for v in pos]
    mask = np.zeros(xm.shape[:-1], bool)
    for pk in picks:
        for k in pk:
            v = srt[..., k : k + 1]
            mask |= np.sum(xm == v, axis=-1) > 1
    if not mask.any():
        return None
    fn = (
        (lambda t: torch.median(t) if dim is None else torch.median(t, dim=dim).values)
        if kind == "median"
        else (lambda t: torch.quantile(t, torch.as_tensor(q, dtype=t.dtype).squeeze(), dim=dim))
    )
    g = _grad_at(fn, x, np.ones((), bool))
    ok = None
    if g is not None:
        ok = bool(np.all(g >= -1e-6) and abs(float(g.sum()) - 1) <= 1e-4)
    got = _fmt(srt[..., picks[0][0]].ravel()[0])
    return LibraryHit("sort-tie", "sort", mask, got, _value(g), ok)
