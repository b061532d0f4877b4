"""The issue's measure on the real-world sets (tests/zero/realworld): the zero's source is the
right line on at least 90% of the cases where it is another line than the origin, the origin on
at least 95%, and no report on the clean controls, in both backends."""

import pytest

from tests.zero.realworld.measure import measure

SIZES = {"": (15, 14, 5), "heldout_": (7, 5, 2)}  # the sets are not shrunk


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["", "heldout_"])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_realworld_bars(backend, prefix):
    r = measure(backend, prefix=prefix)
    (oo, on), (zo, zn), (cr, cn) = r["origin"], r["zero"], r["clean"]
    n_origin, n_zero, n_clean = SIZES[prefix]
    assert on >= n_origin and zn >= n_zero and cn >= n_clean
    assert oo >= 0.95 * on, r
    assert zo >= 0.90 * zn, r
    assert cr == 0, r
