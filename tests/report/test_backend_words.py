"""A torch report never tells the user to call JAX (jnp., jax., lax.), and a JAX report never
tells them to call torch: every catalog entry's text as each backend renders it (title, sets,
explanation, each fix's summary and code, that backend's convention), and the fixes a report
prints for it, are scanned. Shared text may name the other framework when it compares them
("PyTorch returns the subgradient 0"), never its functions."""

import re

import pytest

from gradsan import _catalog
from gradsan._fix import proposals

JAX_ONLY = re.compile(r"(?<![\w.])(jnp|jax|lax)\.|\(JAX\)")
TORCH_ONLY = re.compile(r"(?<![\w.])(torch|F|nn)\.|Backward\d|\(PyTorch\)")
OTHER = {"torch": JAX_ONLY, "jax": TORCH_ONLY}


def rendering(entry, backend):
    """(where, text) for everything a ``backend`` user reads of ``entry``."""
    yield "title", entry.title
    yield "singular_set", entry.singular_set
    yield "derivative", entry.derivative
    yield "subdifferential", entry.subdifferential or ""
    yield "explanation", entry.explanation
    yield f"conventions[{backend}]", entry.conventions.get(backend, "")
    for i, fx in enumerate(entry.fixes):
        yield f"fixes[{i}] summary", fx.summary_for(backend)
        yield f"fixes[{i}] code", fx.code(backend)
    for p in proposals(entry.id, backend, None):
        yield "printed fix", p.text()


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_no_entry_speaks_the_other_framework(backend):
    bad = []
    for entry in _catalog.ENTRIES:
        for where, text in rendering(entry, backend):
            m = OTHER[backend].search(text)
            if m:
                bad.append(f"{entry.id} {where}: ...{text[max(0, m.start() - 40) : m.end() + 20]}")
    assert not bad, "\n".join(bad)


def test_the_scan_catches_the_other_frameworks_names():
    assert JAX_ONLY.search("Pass the mask to softmax (JAX), or mask")
    assert JAX_ONLY.search("so that jnp.power and torch.pow return it")
    assert not JAX_ONLY.search("p = gradsan.torch.safe.softmax(z)")
    assert TORCH_ONLY.search("p = torch.softmax(z, dim=-1)")
    assert TORCH_ONLY.search("F.normalize(x)") and TORCH_ONLY.search("SoftmaxBackward0")
    assert not TORCH_ONLY.search("logp = jax.nn.log_softmax(z)  # gradsan.jax.safe.x")


def test_torch_softmax_report_has_no_jax_advice():
    torch = pytest.importorskip("torch")
    import gradsan.torch as gst

    def step(x):
        z = torch.where(torch.tensor([False, False]), x, -torch.inf)  # a fully masked row
        loss = torch.softmax(z, dim=-1).sum()
        loss.backward()
        return loss

    report = gst.explain(step)(torch.tensor([0.0, 1.0], requires_grad=True))
    ids = [f.catalog_id for f in report.findings]
    assert "softmax-all-neg-inf" in ids, str(report)
    assert "(JAX)" not in str(report) and "jax." not in str(report)
    assert "most negative finite number" in str(report)
