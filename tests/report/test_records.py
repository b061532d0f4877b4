"""Finding's typed details and the mapping view the former ``detail`` dict readers use."""

import json

import pytest

from gradsan import Finding, Frame, OutputHit, Report
from gradsan._report._records import (
    CertificateDetails,
    KinkDetails,
    OriginDetails,
    RepairDetails,
    details_from,
)


def _finding(kind="nonfinite", **kw):
    kw.setdefault("where", None)
    return Finding(kind=kind, catalog_id=None, phase="gradient", primitive="sqrt", **kw)


def test_a_plain_mapping_becomes_the_typed_details_of_the_kind():
    f = _finding(detail={"met_text": "0/0 = NaN in aten.div", "node": "SqrtBackward0"})
    assert isinstance(f.detail, OriginDetails)
    assert f.detail.met_text == "0/0 = NaN in aten.div" and f.detail["node"] == "SqrtBackward0"
    assert dict(f.detail) == {"node": "SqrtBackward0", "met_text": "0/0 = NaN in aten.div"}
    assert f.detail == {"met_text": "0/0 = NaN in aten.div", "node": "SqrtBackward0"}
    assert isinstance(_finding("resolved").detail, RepairDetails)
    assert isinstance(_finding("kink").detail, KinkDetails)
    assert isinstance(_finding("certified").detail, CertificateDetails)


def test_unset_facts_are_absent_from_the_mapping():
    d = OriginDetails(note="it returned nan")
    assert "met_text" not in d and d.get("met_text") is None and list(d) == ["note"]
    with pytest.raises(KeyError):
        d["met_text"]
    d.setdefault("note", "other")
    d.setdefault("got", "0.0")
    assert d == {"note": "it returned nan", "got": "0.0"}
    del d["got"]
    assert "got" not in d and d.got is None


def test_writes_go_to_the_typed_fields():
    f = _finding("unresolved", detail={"rule": "none: the zero is numerical"})
    assert isinstance(f.detail, RepairDetails)  # the one class that declares `rule`
    f.detail["count"] = 3
    assert f.detail.count == 3 and f.detail.extra == {}


def test_keys_of_another_kind_pick_the_class_that_declares_them():
    # subgradient reports an unlocked branch as kind "unresolved" with kink facts
    d = details_from("unresolved", {"op": "max", "branch": "not locked", "unbroken": 2})
    assert isinstance(d, KinkDetails) and d.unbroken == 2 and d.extra == {}


def test_an_undeclared_key_is_kept_in_extra():
    d = details_from("nonfinite", {"something_new": 1})
    assert d["something_new"] == 1 and d.extra == {"something_new": 1}


def test_certificate_keys_that_are_not_names_and_kept_nones():
    d = details_from(
        "certified", {"label": "singular", "f(x0)": float("nan"), "differentiable": None}
    )
    assert isinstance(d, CertificateDetails)
    assert d.label == "singular" and d["f(x0)"] != d["f(x0)"]
    assert "differentiable" in d and d["differentiable"] is None
    d["rule"] = "limit engine (gradsan.jax.certify): the gradient"  # nansafe reuses the finding
    assert d.rule.startswith("limit engine")


def test_to_dict_and_json_carry_the_details_and_the_numbers():
    where = Frame("loss.py", 3, 4, "loss", "    y = sqrt(x)", 12)
    f = _finding(
        where=where,
        count=2,
        size=4,
        index=(0, 1),
        outputs=[OutputHit("x", 2, 4, 2, 0, "grad")],
        detail={"got": "0.0"},
        got_value=0.0,
    )
    d = f.to_dict()
    assert d["detail"] == {"got": "0.0"} and d["index"] == [0, 1] and d["got_value"] == 0.0
    assert d["where"]["column"] == 4 and d["outputs"][0]["nan"] == 2
    data = json.loads(Report(findings=[f]).to_json())
    assert data["findings"][0]["count"] == 2 and data["findings"][0]["got_value"] == 0.0
