"""The user's statement under a frame's caret, as a syntax tree.

A :class:`Site` holds the parsed file, the expression whose position is the frame's column range,
the statement that holds it, the enclosing function, and what the module imports (``jnp`` is
``jax.numpy``), so that a rewriter can name things the way the file does.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import linecache
import os
import tokenize

from .._report._records import Frame

_BUILTINS = frozenset(dir(builtins))


@dataclasses.dataclass
class Site:
    file: str
    source: str
    lines: list[str]  # the file's lines, with their line ends
    tree: ast.Module
    node: ast.expr
    stmt: ast.stmt
    func: ast.FunctionDef | ast.AsyncFunctionDef | None  # innermost enclosing def
    in_lambda: bool  # the node is inside a lambda or a comprehension
    parents: dict[int, ast.AST]
    aliases: dict[str, str]  # a name the module binds to a module or function -> its dotted path
    # the source split as ast.get_source_segment splits it (once per file, not per segment)
    split: list[str] | None = dataclasses.field(default=None, repr=False, compare=False)

    def segment(self, node: ast.AST) -> str:
        if self.split is None:
            return ast.get_source_segment(self.source, node) or ""
        return _segment(self.split, node)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def qualname(self, func: ast.expr) -> str | None:
        """``jax.numpy.sqrt`` for ``jnp.sqrt`` when the module did ``import jax.numpy as jnp``."""
        parts: list[str] = []
        n: ast.expr = func
        while isinstance(n, ast.Attribute):
            parts.append(n.attr)
            n = n.value
        if not isinstance(n, ast.Name):
            return None
        if n.id in self.aliases:
            head = self.aliases[n.id]
        elif n.id in _BUILTINS and not parts:
            head = "builtins." + n.id
        else:
            return None
        return ".".join([head, *reversed(parts)])

    def alias_for(self, module: str) -> str | None:
        """The name this file uses for ``module`` (``jnp`` for ``jax.numpy``), or a dotted path
        through an imported parent (``jax.numpy`` when only ``jax`` is imported)."""
        for name, path in self.aliases.items():
            if path == module:
                return name
        for name, path in self.aliases.items():
            if module.startswith(path + "."):
                return name + module[len(path) :]
        return None

    def names_in_scope(self) -> set[str]:
        """Every name the statement's function can see: its own, its enclosing functions', the
        module's and the builtins."""
        names = set(_BUILTINS) | module_names(self.tree)
        n: ast.AST | None = self.stmt
        while n is not None:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                names |= function_names(n)
            n = self.parent(n)
        return names


def _bound(nodes: list[ast.stmt]) -> set[str]:
    out: set[str] = set()
    for n in nodes:
        for m in ast.walk(n):
            if isinstance(m, ast.Name) and isinstance(m.ctx, (ast.Store, ast.Del)):
                out.add(m.id)
            elif isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(m.name)
            elif isinstance(m, (ast.Import, ast.ImportFrom)):
                for a in m.names:
                    out.add((a.asname or a.name).split(".")[0])
            elif isinstance(m, ast.arg):
                out.add(m.arg)
    return out


def module_names(tree: ast.Module) -> set[str]:
    for idx in _INDEX.values():
        if idx.tree is tree:
            return set(idx.names)
    return _bound(tree.body)


def function_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    a = fn.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    if a.vararg:
        names.add(a.vararg.arg)
    if a.kwarg:
        names.add(a.kwarg.arg)
    body = fn.body if isinstance(fn.body, list) else []
    return names | _bound(body)


def _aliases(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    head = a.name.split(".")[0]
                    out.setdefault(head, head)
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            for a in n.names:
                out[a.asname or a.name] = f"{n.module}.{a.name}"
    return out


_PARSED: dict[str, tuple[tuple[int, int], str, ast.Module]] = {}


def parsed(file: str) -> tuple[str, ast.Module] | None:
    """The file's text and syntax tree (cached by modification time and size); None if it cannot
    be read or parsed. A file that is not on disk (a notebook cell) is read through linecache."""
    try:
        st = os.stat(file)
        key = (st.st_mtime_ns, st.st_size)
    except OSError:
        st, key = None, (-1, -1)
    hit = _PARSED.get(file)
    if hit is not None and hit[0] == key:
        return hit[1], hit[2]
    if st is not None:
        try:
            with tokenize.open(file) as fh:
                src = fh.read()
        except (OSError, SyntaxError, UnicodeDecodeError):
            return None
    else:
        src = "".join(linecache.getlines(file))
    if not src:
        return None
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    _PARSED[file] = (key, src, tree)
    return src, tree


@dataclasses.dataclass
class _Index:
    """What ``locate`` reads of a whole file, once per parsed tree (the tree is shared and never
    changed): each node's parent, the expressions by their start, the module's aliases and
    the names it binds."""

    tree: ast.Module
    parents: dict[int, ast.AST]
    starts: dict[tuple[int, int], list[ast.expr]]  # (line, column) -> those nodes, walk order
    aliases: dict[str, str]
    names: frozenset[str]
    split: list[str] | None


_INDEX: dict[str, _Index] = {}


def _splitlines(src: str) -> list[str] | None:
    """The lines ``ast.get_source_segment`` cuts from (its own splitter, where it has one)."""
    split = getattr(ast, "_splitlines_no_ff", None)
    try:
        return list(split(src)) if split is not None else None
    except TypeError:
        return None


def _segment(lines: list[str], node: ast.AST) -> str:
    """``ast.get_source_segment(source, node) or ""`` from the source's split lines."""
    try:
        if node.end_lineno is None or node.end_col_offset is None:  # type: ignore[attr-defined]
            return ""
        lineno = node.lineno - 1  # type: ignore[attr-defined]
        end_lineno = node.end_lineno - 1  # type: ignore[attr-defined]
        col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    except AttributeError:
        return ""
    if end_lineno == lineno:
        return lines[lineno].encode()[col:end_col].decode()
    first = lines[lineno].encode()[col:].decode()
    last = lines[end_lineno].encode()[:end_col].decode()
    return "".join([first, *lines[lineno + 1 : end_lineno], last])


def _index(file: str, src: str, tree: ast.Module) -> _Index:
    hit = _INDEX.get(file)
    if hit is not None and hit.tree is tree:
        return hit
    parents: dict[int, ast.AST] = {}
    starts: dict[tuple[int, int], list[ast.expr]] = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parents[id(c)] = n
        if isinstance(n, ast.expr):
            starts.setdefault((n.lineno, n.col_offset), []).append(n)
    split = _splitlines(src)
    idx = _Index(tree, parents, starts, _aliases(tree), frozenset(_bound(tree.body)), split)
    _INDEX[file] = idx
    return idx


def locate(where: Frame | None) -> Site | None:
    """The site of ``where``: None when the frame has no column range or its file cannot be
    parsed or no expression sits exactly at that range."""
    if where is None or where.column is None or where.end_column is None:
        return None
    got = parsed(where.file)
    if got is None:
        return None
    src, tree = got
    idx = _index(where.file, src, tree)
    parents = idx.parents
    best: ast.expr | None = None
    for n in idx.starts.get((where.line, where.column), ()):
        if (n.end_lineno == where.line and n.end_col_offset == where.end_column) or (
            n.end_lineno != where.line and best is None
        ):
            if best is None or (
                best.end_lineno != where.line and n.end_lineno == where.line
            ):  # the exact range wins over a multi-line guess
                best = n
    if best is None:
        return None
    stmt: ast.AST | None = best
    in_lambda = False
    while stmt is not None and not isinstance(stmt, ast.stmt):
        if isinstance(
            stmt, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
        ):
            in_lambda = True
        stmt = parents.get(id(stmt))
    if stmt is None:
        return None
    func: ast.AST | None = stmt
    while func is not None and not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        func = parents.get(id(func))
    assert isinstance(stmt, ast.stmt)
    return Site(
        file=where.file,
        source=src,
        lines=src.splitlines(keepends=True),
        tree=tree,
        node=best,
        stmt=stmt,
        func=func if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else None,
        in_lambda=in_lambda,
        parents=parents,
        aliases=dict(idx.aliases),
        split=idx.split,
    )
