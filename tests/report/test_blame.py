"""The one dataflow blame over its node protocol (gradsan/_blame.py)."""

import dataclasses

from gradsan import _blame as Z
from gradsan._blame import Blame
from gradsan._events import ZeroKind
from gradsan._report._records import Frame


@dataclasses.dataclass(eq=False)
class N:
    name: str
    ins: list = dataclasses.field(default_factory=list)
    new_nan: bool = False  # made a NaN from non-NaN inputs
    intentional: bool = False

    def __repr__(self):
        return self.name


class G:
    def __init__(self):
        self.calls = 0

    def key(self, v):
        return id(v)

    def children(self, v):
        self.calls += 1
        return v.ins

    def is_poison(self, v):
        return v.new_nan

    def is_intentional(self, r):
        return r.intentional

    def record(self, v):
        return v


def test_origin_and_its_poison():
    sqrt = N("sqrt")  # an inf from finite inputs
    mul = N("mul", [sqrt], new_nan=True)  # inf * 0 = nan
    out = N("sum", [mul])
    assert Blame(G()).origins(out) == [(sqrt, mul)]


def test_a_root_that_is_a_poison_is_its_own_poison():
    div = N("div", new_nan=True)  # 0 / 0 from finite inputs
    assert Blame(G()).origins(N("sum", [div])) == [(div, div)]


def test_the_first_poison_on_the_path_is_kept():
    log = N("log")
    mul1 = N("mul", [log], new_nan=True)
    mul2 = N("mul", [mul1], new_nan=True)
    assert Blame(G()).origins(mul2) == [(log, mul1)]


def test_intentional_infs_make_the_poison_the_origin():
    mask = N("masked_fill", intentional=True)  # -inf on purpose
    sub = N("sub", [mask, mask], new_nan=True)  # -inf - (-inf) = nan
    assert Blame(G()).origins(N("exp", [sub])) == [(sub, None)]
    # an intentional inf read by no poison is still the origin
    assert Blame(G()).origins(N("exp", [mask])) == [(mask, None)]


def test_several_origins_in_walk_order_and_memoised():
    a, b = N("a"), N("b")
    add = N("add", [a, b])
    out1, out2 = N("o1", [add]), N("o2", [add])
    g = G()
    blame = Blame(g)
    assert blame.origins(out1) == [(a, None), (b, None)]
    calls = g.calls
    assert blame.origins(out2) == [(a, None), (b, None)]
    assert g.calls == calls + 1  # only out2 itself was expanded
    blame.clear()
    assert blame.origins(out2) == [(a, None), (b, None)] and g.calls > calls + 1


def test_a_cycle_is_cut():
    a = N("a")
    b = N("b", [a])
    a.ins = [b]
    assert Blame(G()).origins(N("o", [b])) == []


def test_records_name_the_origin():
    """Handles may be (node, output index) pairs; two handles of one node are one origin."""

    class Pairs(G):
        def key(self, v):
            return (id(v[0]), v[1])

        def children(self, v):
            return [(c, 0) for c in v[0].ins]

        def is_poison(self, v):
            return v[0].new_nan

        def record(self, v):
            return v[0]

    split = N("split")
    mul = N("mul", [split, split], new_nan=True)
    assert Blame(Pairs()).origins((mul, 0)) == [(split, mul)]


class JaxGraph:
    """jax/_explain's provenance nodes as the blame protocol: handles are (Node, output index)
    pairs. This adapter is what jax/_explain.Blame becomes when it moves onto gradsan/_blame."""

    def __init__(self, explain):
        self.x = explain

    def _bad(self, v):
        return [s for s in v[0].ins if self.x._stat(s) != self.x.FINITE]

    def key(self, v):
        return (id(v[0]), v[1])

    def children(self, v):
        node, k = v
        if node.kind in ("input", "const"):
            return []
        bad = self._bad(v)
        if node.kind == "stack":
            return bad[:1]
        if node.status[k] == self.x.NAN:
            return [s for s in bad if self.x._stat(s) == self.x.NAN] or bad
        return bad

    def is_poison(self, v):
        node, k = v
        bad = self._bad(v)
        return (
            node.kind == "eqn"
            and node.status[k] == self.x.NAN
            and bool(bad)
            and not any(self.x._stat(s) == self.x.NAN for s in bad)
        )

    def is_intentional(self, r):
        return r.kind == "const"

    def record(self, v):
        return v[0]


class ReferenceBlame:
    """jax/_explain's own blame before it moved onto gradsan/_blame, kept as the reference."""

    def __init__(self, x):
        self.x = x
        self.memo = {}

    def _children(self, node, k):
        x = self.x
        if node.kind in ("input", "const"):
            return []
        bad = [s for s in node.ins if x._stat(s) != x.FINITE]
        if node.kind == "stack":
            return bad[:1]
        if node.status[k] == x.NAN:
            return [s for s in bad if x._stat(s) == x.NAN] or bad
        return bad

    def _combine(self, node, k, children):
        x = self.x
        if not children:
            return {id(node): (node, None)}
        bad = [s for s in node.ins if x._stat(s) != x.FINITE]
        is_poison = (
            node.kind == "eqn"
            and node.status[k] == x.NAN
            and not any(x._stat(s) == x.NAN for s in bad)
        )
        out = {}
        for c in children:
            for key, (origin, poison) in self.memo[(id(c[0]), c[1])].items():
                if is_poison and origin.kind == "const":
                    out.setdefault(id(node), (node, None))
                    continue
                if poison is None and is_poison:
                    poison = node
                out.setdefault(key, (origin, poison))
        return out

    def origins(self, src):
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


def _random_graph(rng, explain):
    nodes = []
    for i in range(rng.integers(1, 12)):
        kind = "eqn" if i >= 2 and rng.random() < 0.7 else str(rng.choice(["input", "const"]))
        if kind == "eqn" and rng.random() < 0.1:
            kind = "stack"
        n_out = int(rng.integers(1, 3))
        status = tuple(int(rng.choice([explain.INF, explain.NAN])) for _ in range(n_out))
        ins = ()
        if kind in ("eqn", "stack") and nodes:
            ins = tuple(
                None
                if rng.random() < 0.2
                else (p := nodes[rng.integers(len(nodes))], int(rng.integers(len(p.status))))
                for _ in range(rng.integers(1, 4))
            )
        nodes.append(explain.Node(kind=kind, ins=ins, status=status, seq=i))
    return nodes


def test_jax_explain_blames_as_before_it_moved_onto_gradsan_blame():
    np = __import__("pytest").importorskip("numpy")
    explain = __import__("pytest").importorskip("gradsan.jax._explain")
    rng = np.random.default_rng(0)
    for _ in range(300):
        nodes = _random_graph(rng, explain)
        want_blame, got_blame = ReferenceBlame(explain), Blame(explain._Dataflow())
        adapter = Blame(JaxGraph(explain))
        for node in reversed(nodes):
            for k in range(len(node.status)):
                want = want_blame.origins((node, k))
                assert explain._origins(got_blame, (node, k)) == want
                found = adapter.origins((node, k))
                assert ([f for f in found if f[0].kind != "const"] or found) == want


# ---- the zero's side: one classification for both backends ------------------------------------


F12 = Frame("loss.py", 12, function="loss", code="return jnp.where(x > 0, y, 0.0)")
F20 = Frame("loss.py", 20, function="loss", code="y = d * MASK")


def test_classify_zero_names_the_where_that_chose_a_literal_zero():
    path = [Z.ZeroStep(Z.PASS), Z.ZeroStep(Z.SELECT, frame=F12), Z.ZeroStep(Z.LITERAL)]
    src = Z.classify_zero(path)
    assert src is not None and src.kind is ZeroKind.WHERE and src.frame == F12


def test_classify_zero_mask_slice_derivative_and_births():
    mask = [Z.ZeroStep(Z.MUL, frame=F20, backward=True), Z.ZeroStep(Z.CONST)]
    assert Z.classify_zero(mask).kind is ZeroKind.MASK
    drop = [Z.ZeroStep(Z.DROP, frame=F20), Z.ZeroStep(Z.LITERAL)]
    assert Z.classify_zero(drop).kind is ZeroKind.SLICE
    deriv = [Z.ZeroStep(Z.MUL, backward=True), Z.ZeroStep(Z.DERIVATIVE, frame=F20)]
    assert Z.classify_zero(deriv).kind is ZeroKind.DERIVATIVE
    assert Z.classify_zero([Z.ZeroStep(Z.UNDERFLOW, frame=F20)]).kind is ZeroKind.UNDERFLOW
    assert Z.classify_zero([Z.ZeroStep(Z.BY_DESIGN, frame=F20)]).kind is ZeroKind.BY_DESIGN
    # a zero in the input, met by the cotangent of a product: that product's derivative
    inp = [Z.ZeroStep(Z.MUL, frame=F20, backward=True), Z.ZeroStep(Z.INPUT, text="x")]
    assert Z.classify_zero(inp).kind is ZeroKind.DERIVATIVE
    assert Z.classify_zero([Z.ZeroStep(Z.INPUT, text="x")]).kind is ZeroKind.INPUT
    assert Z.classify_zero([]) is None


def test_classify_zero_takes_the_nearest_line_for_library_steps():
    # a select inside a library function has no frame of its own: the nearest user line
    path = [Z.ZeroStep(Z.PASS, frame=F12), Z.ZeroStep(Z.SELECT, library="jnp.nan_to_num")]
    path.append(Z.ZeroStep(Z.LITERAL))
    src = Z.classify_zero(path)
    assert src.kind is ZeroKind.NAN_TO_NUM and src.frame == F12
