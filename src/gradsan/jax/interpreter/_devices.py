"""Entering ``shard_map`` (and ``pmap``, which JAX lowers to it): the body runs once per device
of the mesh on that device's block of each operand, all devices in lockstep, and collectives
(``psum``, ``pmean``, ``all_gather``, ``ppermute``, ``all_to_all``, ``axis_index``, ...) are
evaluated across the devices' blocks with numpy. So values, and the sidecars that follow them,
cross devices the way the program moves them.

A body whose nested bodies (a scan, a cond) hold a collective, or a mesh whose axes are not all
manual, is not entered: :func:`enter_shard_map` returns None and the caller runs the equation as
one operation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from jax.extend import core as jcore

from .. import _compat
from ._core import Interpreter, Scope

__all__ = ["Layout", "Shard", "enter_shard_map", "holder", "shard_map_rule"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh as gradsan walks it: axis names and sizes, devices in row-major order."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def coords(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*[range(s) for s in self.sizes]))

    def describe(self, coord: tuple[int, ...]) -> str:
        d = int(np.ravel_multi_index(coord, self.sizes)) if self.sizes else 0
        at = ", ".join(f"{n}={c}" for n, c in zip(self.names, coord))
        return f"device {d} of {math.prod(self.sizes)} ({at})"

    def _axes(self, axes: Any) -> tuple[int, ...]:
        axes = axes if isinstance(axes, (tuple, list)) else (axes,)
        return tuple(self.names.index(a) for a in axes)

    def group(self, coord: tuple[int, ...], axes: Any) -> list[int]:
        """Devices (indices into :attr:`coords`) that share every coordinate but ``axes``,
        ordered by their linear index over ``axes`` (in the order ``axes`` names them)."""
        ax = self._axes(axes)
        members = []
        for j, c in enumerate(self.coords):
            if all(c[k] == coord[k] for k in range(len(self.names)) if k not in ax):
                members.append((tuple(c[k] for k in ax), j))
        members.sort()
        return [j for _, j in members]

    def index_in(self, coord: tuple[int, ...], axes: Any) -> int:
        ax = self._axes(axes)
        idx = 0
        for k in ax:
            idx = idx * self.sizes[k] + coord[k]
        return idx


@dataclasses.dataclass(frozen=True)
class Shard:
    """One device of a shard_map: where it sits in the mesh, and where its blocks of the body's
    inputs sit in the global arrays."""

    layout: Layout
    coord: tuple[int, ...]
    blocks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (block shape, global start)

    @property
    def device(self) -> int:
        return int(np.ravel_multi_index(self.coord, self.layout.sizes)) if self.coord else 0

    @property
    def where(self) -> str:
        return self.layout.describe(self.coord)

    def global_index(self, shape: tuple, index: tuple) -> tuple[int, ...] | None:
        """The global index of element ``index`` of a value of ``shape`` on this device, when
        the value is laid out like the input blocks: it has the shape of an input block, or of
        its leading dimensions (a per-row reduction); None when that is ambiguous or unknown."""
        shape, n = tuple(shape), len(shape)
        if len(index) != n:
            return None
        starts = {st[:n] for shp, st in self.blocks if tuple(shp)[:n] == shape and len(shp) >= n}
        if len(starts) != 1:
            return None
        (start,) = starts
        return tuple(int(s + i) for s, i in zip(start, index))


# -- blocks -------------------------------------------------------------------------------------


def _dim_axes(spec: Any, ndim: int) -> list[tuple[str, ...]]:
    """Per dimension, the mesh axes it is split over (P('data', None) -> [('data',), ()])."""
    entries = list(spec) if spec is not None else []
    out: list[tuple[str, ...]] = []
    for d in range(ndim):
        e = entries[d] if d < len(entries) else None
        if e is None:
            out.append(())
        elif isinstance(e, (tuple, list)):
            out.append(tuple(e))
        else:
            out.append((e,))
    return out


def _block_slices(layout: Layout, spec: Any, shape: tuple, coord: tuple) -> tuple:
    slices = []
    for d, axes in enumerate(_dim_axes(spec, len(shape))):
        if not axes:
            slices.append(slice(None))
            continue
        n = math.prod(layout.sizes[layout.names.index(a)] for a in axes)
        size = shape[d] // n
        i = layout.index_in(coord, axes)
        slices.append(slice(i * size, (i + 1) * size))
    return tuple(slices)


def _block(layout: Layout, x: Any, spec: Any, coord: tuple) -> Any:
    a = np.asarray(x)
    return a[_block_slices(layout, spec, a.shape, coord)]


def _assemble(layout: Layout, blocks: list, spec: Any, aval: Any) -> np.ndarray:
    out = np.empty(aval.shape, dtype=np.asarray(blocks[0]).dtype)
    for coord, b in zip(layout.coords, blocks):
        out[_block_slices(layout, spec, out.shape, coord)] = np.asarray(b)
    return out


# -- collectives, in numpy ----------------------------------------------------------------------

Collective = Callable[[Layout, Any, list], list]  # (layout, eqn, per-device invals) -> outvals


def _reduce(fn: Callable) -> Collective:
    def rule(layout: Layout, eqn: Any, ins: list) -> list:
        axes = eqn.params["axes"]
        outs = []
        for coord in layout.coords:
            vals = [np.asarray(ins[j][0]) for j in layout.group(coord, axes)]
            outs.append([fn(np.stack(vals), axis=0).astype(vals[0].dtype)])
        return outs

    return rule


def _identity(layout: Layout, eqn: Any, ins: list) -> list:
    return [list(v) for v in ins]


def _axis_index(layout: Layout, eqn: Any, ins: list) -> list:
    dt = eqn.outvars[0].aval.dtype
    return [
        [np.asarray(layout.index_in(c, eqn.params["axis_name"]), dtype=dt)] for c in layout.coords
    ]


def _all_gather(layout: Layout, eqn: Any, ins: list) -> list:
    p = eqn.params
    dim, tiled = p["all_gather_dimension"], p["tiled"]
    outs = []
    for coord in layout.coords:
        vals = [np.asarray(ins[j][0]) for j in layout.group(coord, p["axis_name"])]
        outs.append([np.concatenate(vals, axis=dim) if tiled else np.stack(vals, axis=dim)])
    return outs


def _ppermute(layout: Layout, eqn: Any, ins: list) -> list:
    p = eqn.params
    axes = p["axis_name"]
    outs = []
    for coord in layout.coords:
        me = layout.index_in(coord, axes)
        group = layout.group(coord, axes)
        src = [s for s, d in p["perm"] if d == me]
        x = np.asarray(ins[group[src[0]]][0]) if src else np.zeros_like(np.asarray(ins[0][0]))
        outs.append([x])
    return outs


def _all_to_all(layout: Layout, eqn: Any, ins: list) -> list:
    p = eqn.params
    split, concat, axes = p["split_axis"], p["concat_axis"], p["axis_name"]
    outs = []
    for coord in layout.coords:
        group = layout.group(coord, axes)
        me = layout.index_in(coord, axes)
        parts = [np.array_split(np.asarray(ins[j][0]), len(group), axis=split)[me] for j in group]
        outs.append([np.concatenate(parts, axis=concat)])
    return outs


def _reduce_scatter(layout: Layout, eqn: Any, ins: list) -> list:
    p = eqn.params
    dim, axes, tiled = p["scatter_dimension"], p["axis_name"], p["tiled"]
    outs = []
    for coord in layout.coords:
        group = layout.group(coord, axes)
        vals = [np.asarray(ins[j][0]) for j in group]
        total = np.sum(np.stack(vals), axis=0).astype(vals[0].dtype)
        part = np.array_split(total, len(group), axis=dim)[layout.index_in(coord, axes)]
        outs.append([part if tiled else np.squeeze(part, axis=dim)])
    return outs


COLLECTIVES: dict[Any, Collective] = {}
for _name, _rule in (
    ("psum", _reduce(np.sum)),
    ("psum_invariant", _reduce(np.sum)),
    ("pmax", _reduce(np.max)),
    ("pmin", _reduce(np.min)),
    ("pvary", _identity),
    ("axis_index", _axis_index),
    ("all_gather", _all_gather),
    ("all_gather_invariant", _all_gather),
    ("ppermute", _ppermute),
    ("all_to_all", _all_to_all),
    ("reduce_scatter", _reduce_scatter),
):
    _p = _compat.collective_primitive(_name)
    if _p is not None:
        COLLECTIVES[_p] = _rule


def _nested_collective(jaxpr: Any, top: bool = True) -> bool:
    """Whether a collective sits in a body nested inside ``jaxpr`` (not in lockstep)."""
    for eqn in jaxpr.eqns:
        if not top and eqn.primitive in COLLECTIVES:
            return True
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(sub, (jcore.Jaxpr, jcore.ClosedJaxpr)):
                    j = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
                    if _nested_collective(j, top=False):
                        return True
    return False


# -- the lockstep run ---------------------------------------------------------------------------


def _run_lockstep(
    interp: Interpreter,
    layout: Layout,
    jaxpr: Any,
    args_by_dev: list[list],
    sides_by_dev: list[list],
    scopes: list[Scope],
) -> tuple[list[list], list[list]]:
    n = len(scopes)
    envs: list[dict] = [{} for _ in range(n)]
    side_envs: list[dict] = [{} for _ in range(n)]
    for d in range(n):
        for v, a, s in zip(jaxpr.invars, args_by_dev[d], sides_by_dev[d]):
            envs[d][v] = a
            side_envs[d][v] = s

    def read(d: int, vs: list) -> tuple[list, list]:
        vals, sides = [], []
        for v in vs:
            if isinstance(v, jcore.Literal):
                vals.append(v.val)
                sides.append(interp.literal_side(v.val))
            else:
                vals.append(envs[d][v])
                sides.append(side_envs[d][v])
        return vals, sides

    for i, eqn in enumerate(jaxpr.eqns):
        ins = [read(d, eqn.invars) for d in range(n)]
        collective = COLLECTIVES.get(eqn.primitive)
        if collective is not None:
            outs_by_dev = collective(layout, eqn, [vals for vals, _ in ins])
            all_sides = [s for _, sides in ins for s in sides]
            results = [
                (
                    outs_by_dev[d],
                    interp.collective_side(
                        eqn, ins, outs_by_dev[d], all_sides, scopes[d], (*scopes[d].key, i)
                    ),
                )
                for d in range(n)
            ]
        else:
            results = []
            for d in range(n):
                key = (*scopes[d].key, i)
                rule = interp.rules.get(eqn.primitive)
                if rule is not None:
                    results.append(rule(interp, eqn, ins[d][0], ins[d][1], scopes[d], key))
                else:
                    results.append(interp.dispatch(eqn, ins[d][0], ins[d][1], scopes[d], key))
        for d, (outvals, outsides) in enumerate(results):
            for v, val, s in zip(eqn.outvars, outvals, outsides):
                if not isinstance(v, jcore.DropVar):
                    envs[d][v] = val
                    side_envs[d][v] = s
    outs = [read(d, jaxpr.outvars) for d in range(n)]
    return [o for o, _ in outs], [s for _, s in outs]


def enter_shard_map(
    interp: Interpreter, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list] | None:
    """Run a shard_map's body per device, or None when it cannot be entered."""
    p = eqn.params
    mesh = p.get("mesh")
    if mesh is None or "jaxpr" not in p:
        return None
    layout = Layout(tuple(mesh.axis_names), tuple(int(s) for s in mesh.axis_sizes))
    manual = p.get("newly_manual_axes", p.get("manual_axes", frozenset(layout.names)))
    jaxpr, consts = _compat.closed(p["jaxpr"])
    if set(manual) != set(layout.names) or consts or _nested_collective(jaxpr):
        return None
    in_specs, out_specs = p["in_specs"], p["out_specs"]
    scopes, args_by_dev = [], []
    for coord in layout.coords:
        where = layout.describe(coord)
        sub = interp.sub_scope(
            eqn, scope, (*key, coord), f"shard_map[{where}]", interp.in_context(scope, where)
        )
        blocks = []
        for x, spec in zip(invals, in_specs):
            sl = _block_slices(layout, spec, np.shape(x), coord)
            shape = tuple(len(range(*s.indices(n))) for s, n in zip(sl, np.shape(x)))
            blocks.append((shape, tuple(s.indices(n)[0] for s, n in zip(sl, np.shape(x)))))
        sub.shard = Shard(layout, coord, tuple(blocks))
        scopes.append(sub)
        args_by_dev.append([_block(layout, x, s, coord) for x, s in zip(invals, in_specs)])
    outs_by_dev, sides_by_dev = _run_lockstep(
        interp, layout, jaxpr, args_by_dev, [list(insides)] * len(scopes), scopes
    )
    outvals, outsides = [], []
    for j, (v, spec) in enumerate(zip(eqn.outvars, out_specs)):
        outvals.append(_assemble(layout, [o[j] for o in outs_by_dev], spec, v.aval))
        outsides.append(interp.stack_side([s[j] for s in sides_by_dev], scope))
    return outvals, outsides


def shard_map_rule(
    interp: Interpreter, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    """Enter the body per device; run it as one operation where it cannot be entered."""
    entered = enter_shard_map(interp, eqn, invals, insides, scope, key)
    if entered is not None:
        return entered
    return interp.first_order(eqn, invals, insides, scope, key)


# -- jit with shardings -------------------------------------------------------------------------


def holder(arrays: list, shape: tuple, index: tuple) -> tuple[int, dict[str, int]] | None:
    """(device id, mesh coordinate) of the device holding element ``index`` of a value laid out
    like one of ``arrays`` (a jit argument sharded over a mesh): the value has that array's
    shape, or its leading dimensions' (a per-row reduction). None when no sharded argument
    fits, or more than one does with different layouts."""
    n = len(index)
    found = set()
    for a in arrays:
        sharding = getattr(a, "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        a_shape = tuple(np.shape(a))
        if mesh is None or len(getattr(sharding, "device_set", ())) < 2 or a_shape[:n] != shape:
            continue
        if len(shape) != n:
            continue
        for dev, slices in sharding.devices_indices_map(a_shape).items():
            if all(i in range(*sl.indices(size)) for i, sl, size in zip(index, slices, a_shape)):
                pos = np.argwhere(np.asarray(mesh.devices) == dev)
                if len(pos):
                    coord = {str(k): int(c) for k, c in zip(mesh.axis_names, pos[0])}
                    found.add((int(dev.id), tuple(coord.items())))
                break
    if len(found) != 1:
        return None
    (dev_id, coord_items) = found.pop()
    return dev_id, dict(coord_items)
