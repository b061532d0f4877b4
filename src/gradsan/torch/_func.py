"""torch.func and ``torch.autograd.grad``: the gradients they return are outputs like ``.grad``.

While a tracing session is open, :class:`Transforms` wraps the functions torch.func's transforms
reach at call time (see ``_compat.functorch_entry_points``), outermost call only:

- ``grad`` / ``grad_and_value`` / ``vjp`` (and ``jacrev``'s vjp) run as they are, under the
  tracer (autograd runs the transform's backward, so the dispatch mode sees its ops); the
  gradients they return are recorded with the argument they belong to;
- ``vmap`` cannot be interpreted (the tracer reads values, and a batched tensor has none): it
  runs with the tracer off, and when its output is non-finite the first non-finite batch
  element is run again eagerly, under the tracer, to explain it (a note says so).

:class:`GradCheck` (guard) checks the same gradients when the transform returns, before the
step can use them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import _compat
from ._mode import all_finite, tensors_in

Recorded = tuple[Any, torch.Tensor, str]  # (argument, its gradient, the API that returned it)


def _diff_args(args: tuple, argnums: Any) -> Any:
    if argnums is None:
        return args
    if isinstance(argnums, int):
        return args[argnums]
    return tuple(args[i] for i in argnums)


def _pairs(args: Any, grads: Any) -> list[tuple[Any, torch.Tensor]]:
    flat_a, _ = tree_flatten(args)
    flat_g, _ = tree_flatten(grads)
    if len(flat_a) != len(flat_g):
        return [(None, g) for g in flat_g if isinstance(g, torch.Tensor)]
    return [(a, g) for a, g in zip(flat_a, flat_g) if isinstance(g, torch.Tensor)]


def _float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


class _Patches:
    """Wraps the entry points for the lifetime of a with-block (outermost call only)."""

    def __init__(self) -> None:
        self.depth = 0
        self._undo: list[tuple[Any, str, Any]] = []
        self._built: dict[str, tuple[Any, Any]] = {}  # name -> (original, its wrapper)
        self._plan: list[tuple[Any, str, str, Callable[[Any], Any]]] | None = None

    def wrappers(self) -> dict[str, Callable[[Any], Any]]:
        raise NotImplementedError

    def __enter__(self) -> _Patches:
        plan = self._plan  # (module, attribute, name, wrapper maker): made once
        if plan is None:
            wrap = self.wrappers()
            points = _compat.functorch_entry_points().items()
            plan = self._plan = [(m, a, n, wrap[n]) for n, (m, a) in points if n in wrap]
        undo = self._undo
        for mod, attr, name, make in plan:
            orig = getattr(mod, attr)
            undo.append((mod, attr, orig))
            setattr(mod, attr, self._wrapped(name, orig, make))
        return self

    def _wrapped(self, name: str, orig: Any, make: Callable[[Any], Any]) -> Any:
        """The wrapper of ``orig``, made once (guard enters its patches on every step)."""
        built = self._built.get(name)
        if built is None or built[0] is not orig:
            built = self._built[name] = (orig, make(orig))
        return built[1]

    def __exit__(self, *exc: Any) -> None:
        for mod, attr, orig in reversed(self._undo):
            setattr(mod, attr, orig)
        self._undo = []

    def inner(self, orig: Callable, *args: Any, **kwargs: Any) -> Any:
        self.depth += 1
        try:
            return orig(*args, **kwargs)
        finally:
            self.depth -= 1

    def returned(self, pairs: list[tuple[Any, torch.Tensor]], api: str) -> None:
        raise NotImplementedError

    inner_grads = 0  # grads/vjps that ran inside an outer transform (vmap(grad(f)), jacrev)

    def _grad(self, orig: Callable) -> Callable:
        def grad_and_value_impl(func, argnums, has_aux, args, kwargs):
            if self.depth:
                self.inner_grads += 1
                return orig(func, argnums, has_aux, args, kwargs)
            res = self.inner(orig, func, argnums, has_aux, args, kwargs)
            self.returned(_pairs(_diff_args(args, argnums), res[0]), "torch.func.grad")
            return res

        return grad_and_value_impl

    def _vjp(self, orig: Callable) -> Callable:
        def _vjp_with_argnums(func, *primals, argnums=None, has_aux=False):
            if self.depth:
                return orig(func, *primals, argnums=argnums, has_aux=has_aux)
            res = self.inner(orig, func, *primals, argnums=argnums, has_aux=has_aux)
            vjp_fn = res[1]
            diff = _diff_args(primals, argnums)

            def vjp_fn_checked(*a: Any, **k: Any) -> Any:
                if self.depth:  # from inside jacrev's (or the user's) vmap
                    self.inner_grads += 1
                    return vjp_fn(*a, **k)
                out = self.inner(vjp_fn, *a, **k)
                self.returned(_pairs(diff, out), "torch.func.vjp")
                return out

            vjp_fn_checked.__name__ = f"vjp of {getattr(func, '__name__', 'f')}"

            return (res[0], vjp_fn_checked, *res[2:])

        return _vjp_with_argnums


class GradCheck(_Patches):
    """guard: a non-finite gradient returned by torch.func (or torch.autograd.grad) stops the
    step where it is returned; ``failed`` says which API returned it."""

    def __init__(self, abort: type[BaseException]) -> None:
        super().__init__()
        self.abort = abort
        self.failed: str | None = None
        self._autograd: Any = None
        # guard, for a step with no optimizer it knows of (a manual ``p.data.add_(p.grad)``
        # update): called after each outermost torch.autograd.backward (Tensor.backward goes
        # through it), to check the gradients before the step's own update; None: not patched
        self.after_backward: Callable[[int], None] | None = None
        self._backward: Any = None
        self.backwards = 0  # outermost backward calls (counted while after_backward is set)

    def wrappers(self) -> dict[str, Callable[[Any], Any]]:
        return {"grad": self._grad, "vjp": self._vjp}

    def __enter__(self) -> GradCheck:
        super().__enter__()
        orig = self._autograd = torch.autograd.grad
        torch.autograd.grad = self._wrapped("autograd.grad", orig, self._autograd_grad)
        if self.after_backward is not None:
            orig = self._backward = torch.autograd.backward  # type: ignore[assignment]
            torch.autograd.backward = self._wrapped("autograd.backward", orig, self._checked_bwd)
        return self

    def _checked_bwd(self, orig: Callable) -> Callable:
        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return orig(*args, **kwargs)
            out = self.inner(orig, *args, **kwargs)
            self.backwards += 1
            check = self.after_backward
            if check is not None:
                check(self.backwards)
            return out

        return backward

    def _autograd_grad(self, orig: Callable) -> Callable:
        @functools.wraps(orig)  # the tracer's TorchFunctionMode recognizes it by name
        def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return orig(outputs, inputs, *args, **kwargs)
            out = self.inner(orig, outputs, inputs, *args, **kwargs)
            self.returned([(None, g) for g in out if g is not None], "torch.autograd.grad")
            return out

        return grad

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.grad = self._autograd
        if self._backward is not None:
            torch.autograd.backward = self._backward
            self._backward = None
        super().__exit__(*exc)

    def returned(self, pairs: list[tuple[Any, torch.Tensor]], api: str) -> None:
        from ._guard import finite

        grads = [g for _, g in pairs if g.is_floating_point()]
        if grads and not finite(grads):
            self.failed = api
            raise self.abort()


class Transforms(_Patches):
    """A tracing session's view of torch.func: the gradients returned, vmap's replays."""

    def __init__(self, tracer: Any) -> None:
        super().__init__()
        self.tracer = tracer
        self.grads: list[Recorded] = []
        # (the user's vmap output, the eager replay's output of batch element b, b)
        self.values: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self.sliced: dict[int, tuple[Any, int]] = {}  # id(slice) -> (argument, b)
        self.notes: list[str] = []

    def wrappers(self) -> dict[str, Callable[[Any], Any]]:
        return {"grad": self._grad, "vjp": self._vjp, "vmap": self._vmap}

    def returned(self, pairs: list[tuple[Any, torch.Tensor]], api: str) -> None:
        self.grads += [(a, g, api) for a, g in pairs]

    def autograd_grad(self, inputs: Any, out: Any) -> None:
        """A ``torch.autograd.grad`` the tracer ran (not one inside a transform)."""
        if self.depth:
            return
        ins = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs or ())
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        self.grads += [
            (a, g, "torch.autograd.grad")
            for a, g in zip(ins, outs)
            if isinstance(g, torch.Tensor) and g is not getattr(a, "grad", None)
        ]

    def _vmap(self, orig: Callable) -> Callable:
        def vmap_impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs):
            if self.depth:
                return orig(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)
            with _compat.without_function_mode(self.tracer._fmode):
                out = self.inner(
                    orig, func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs
                )
            self._replay(func, in_dims, out_dims, args, kwargs, out)
            return out

        return vmap_impl

    def _replay(
        self, func: Callable, in_dims: Any, out_dims: Any, args: tuple, kwargs: dict, out: Any
    ) -> None:
        """Run the first non-finite batch element of a vmap again, eagerly, under the tracer."""
        flat_out = [t for t in tensors_in(out) if _float(t)]
        if all(all_finite(t) for t in flat_out):
            return
        what = getattr(func, "__name__", "the function")
        if not isinstance(out_dims, int) or not (
            isinstance(in_dims, int) or all(d is None or isinstance(d, int) for d in in_dims)
        ):
            self.notes.append(
                f"torch.func.vmap({what}) returned NaN/Inf; gradsan cannot replay a batch "
                "element of nested in_dims/out_dims: call the function on one element under "
                "gradsan.torch.explain to locate it"
            )
            return
        b = n = 0
        for t in flat_out:
            bad = ~torch.isfinite(t.movedim(out_dims, 0).reshape(t.shape[out_dims], -1))
            rows = bad.any(dim=1).nonzero()
            if len(rows):
                b, n = int(rows[0]), t.shape[out_dims]
                break
        dims = [in_dims] * len(args) if isinstance(in_dims, int) else list(in_dims)

        def pick(x: Any, d: int | None) -> Any:
            if d is None:
                return x

            def one(t: Any) -> Any:
                if not isinstance(t, torch.Tensor):
                    return t
                s = t.select(d, b)
                self.sliced[id(s)] = (t, b)
                return s

            return tree_map(one, x)

        sliced = [pick(a, d) for a, d in zip(args, dims)]
        try:
            twin = func(*sliced, **kwargs)
        except Exception as e:  # the replay is only for the explanation
            self.notes.append(
                f"torch.func.vmap({what}) returned NaN/Inf; gradsan could not re-run batch "
                f"element {b} eagerly to explain it ({type(e).__name__}: {e})"
            )
            return
        self.notes.append(
            f"torch.func.vmap({what}) runs without the tracer: gradsan re-ran batch element "
            f"{b} of {n} (the first with a NaN/Inf) eagerly to explain it"
        )
        for user_t, twin_t in zip(flat_out, [t for t in tensors_in(twin) if _float(t)]):
            if not all_finite(twin_t):
                self.values.append((user_t, twin_t, b))


class RunCheck(_Patches):
    """`gradsan run`: ``check(pairs, api)`` with the gradients torch.func returns to the user's
    script (``grad``, ``grad_and_value``, ``vjp``'s function, ``jacrev``, and ``vmap`` of any of
    them), when the outermost transform returns. Installed for the whole run."""

    def __init__(self, check: Callable[[list[tuple[Any, torch.Tensor]], str], None]) -> None:
        super().__init__()
        self.check = check

    def wrappers(self) -> dict[str, Callable[[Any], Any]]:
        return {"grad": self._grad, "vjp": self._vjp, "vmap": self._vmap_grads}

    def returned(self, pairs: list[tuple[Any, torch.Tensor]], api: str) -> None:
        if _compat.in_functorch():  # inside the user's own outer transform: its result is checked
            self.inner_grads += 1
            return
        self.check([(a, g) for a, g in pairs if _float(g)], api)

    def install(self, undo: Callable[[Callable[[], None]], None]) -> RunCheck:
        """Wrap the entry points and ``torch.func.jacrev``; ``undo(fn)`` registers the undo."""
        self.__enter__()
        func_mod = torch.func
        orig_jacrev = func_mod.jacrev
        func_mod.jacrev = self._jacrev(orig_jacrev)  # type: ignore[assignment]

        def restore() -> None:
            func_mod.jacrev = orig_jacrev  # type: ignore[assignment]
            self.__exit__(None, None, None)

        undo(restore)
        return self

    def _vmap_grads(self, orig: Callable) -> Callable:
        def vmap_impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs):
            if self.depth:
                return orig(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)
            before, self.inner_grads = self.inner_grads, 0
            try:
                out = self.inner(
                    orig, func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs
                )
                ran_grads = self.inner_grads > 0
            finally:
                self.inner_grads = before
            if ran_grads:  # vmap(grad(f)): what it returns are gradients
                self.returned([(None, t) for t in tensors_in(out)], "torch.func.vmap")
            return out

        return vmap_impl

    def _jacrev(self, orig: Callable) -> Callable:
        @functools.wraps(orig)
        def jacrev(func: Callable, argnums: Any = 0, *a: Any, **k: Any) -> Any:
            inner = orig(func, argnums, *a, **k)
            has_aux = bool(k.get("has_aux", a[0] if a else False))

            @functools.wraps(inner)
            def jac_fn(*args: Any, **kwargs: Any) -> Any:
                if self.depth or _compat.in_functorch():
                    return inner(*args, **kwargs)
                out = self.inner(inner, *args, **kwargs)
                jac = out[0] if has_aux else out
                self.returned(_pairs(_diff_args(args, argnums), jac), "torch.func.jacrev")
                return out

            return jac_fn

        return jacrev
