"""The family records (flashcheck/families.py) and the recipe for a new family (README, "Adding a
family"): each fact about a family has one home, and a family's skeleton, written in a temporary
folder and registered by one record, is picked up by the engine without editing another file."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from flashcheck import families
from flashcheck.kernels import _common, registry
from flashcheck.oracles.formats import FLOAT_DTYPES
from flashcheck.families import PROPERTIES, load_properties


@pytest.mark.parametrize("name", families.names())
def test_each_record_names_real_parts(name: str) -> None:
    f = families.get(name)
    load_properties()
    assert {r.name for r in f.strategy_classes()} == set(f.module("strategies").CLASSES)
    assert f.property_names() and all((name, p) in PROPERTIES for p in f.property_names())
    assert callable(f.function("oracle")) and callable(f.function("bound"))
    assert f.suite_files() and all(Path(p).name.startswith(f"test_{name}") for p in f.suite_files())


def test_the_frozen_kernel_layer_agrees_with_the_one_home() -> None:
    # kernels/ keeps its own copies (its digest ties the GPU lane's record): they must not drift.
    assert registry.families() == families.names()
    assert registry.ALL_DTYPES == FLOAT_DTYPES == _common.FLOAT_DTYPES
    from flashcheck.kernels.attention_args import effective_scale as kernels_scale
    from flashcheck.oracles.attention import effective_scale

    for scale in (None, 0.1, 1 / 3, 0.125, 2.0, 1e-30, 1e30, 7):
        for d in (1, 3, 64, 80, 96, 128, 256):
            assert effective_scale(scale, d) == kernels_scale(scale, d), (scale, d)


def test_an_unknown_family_is_one_clear_line() -> None:
    with pytest.raises(KeyError, match="no family 'nope'; registered: softmax, attention"):
        families.get("nope")


# ---- a third family's skeleton: "scale", y = 2 x ---------------------------------------------------
# The files a family needs, each as small as it can be. The package name stands for the project's
# folders: kernel.py -> kernels/, oracle.py -> oracles/, strategies.py -> strategies/,
# properties.py -> flashcheck/properties/<name>.py, test_scale.py -> flashcheck/suite/ (README, "Adding a family").
SKELETON = {
    "__init__.py": "",
    "kernel.py": '''
        import torch

        def scale(x: torch.Tensor) -> torch.Tensor:  # the torch reference kernel
            return x * 2

        def scale_wrong(x: torch.Tensor) -> torch.Tensor:  # a bug the property must catch
            return x * 2 + (x.abs() > 1).to(x.dtype) * x.abs() * 2**-20
        ''',
    "oracle.py": '''
        import numpy as np

        from flashcheck.oracles.formats import round_float64, to_float64

        def scale_oracle(x, fmt):
            return round_float64(2 * to_float64(x), fmt)  # exact: doubling only moves the exponent

        def scale_bound(x, fmt):
            return np.zeros_like(to_float64(x))  # bits exact
        ''',
    "strategies.py": '''
        import torch
        from hypothesis import strategies as st

        from flashcheck.strategies.case import Case
        from flashcheck.strategies.records import StrategyClass, by_name

        @st.composite
        def benign_scale(draw, *, dtype):
            xs = draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=16))
            return Case(tensors={"x": torch.tensor(xs, dtype=dtype).reshape(1, -1)}, label="benign")

        CLASS_RECORDS = (StrategyClass("benign", benign_scale),)
        CLASSES = by_name(CLASS_RECORDS)
        ''',
    "properties.py": '''
        import numpy as np

        from flashcheck.oracles.formats import format_of, to_float64
        from flashcheck.families import prop

        from .oracle import scale_oracle

        CORE_PROPERTIES = ("matches_oracle",)

        @prop("scale", "matches_oracle")
        def matches_oracle(spec, case):
            x = case.tensors["x"]
            got, want = to_float64(spec.fn(x)), scale_oracle(x, format_of(x.dtype))
            bad = got != want
            assert not bad.any(), f"{int(bad.sum())} elements differ from 2 x, first at {np.argwhere(bad)[0]}"
        ''',
    "test_scale.py": '''
        import pytest
        from hypothesis import given, settings, strategies as st

        from flashcheck import families
        from flashcheck.properties.runner import check_all

        FAMILY = "scale"
        RECORD = families.get(FAMILY)

        @pytest.mark.parametrize("cls", [r.name for r in RECORD.strategy_classes()])
        @settings(max_examples=5, deadline=None, database=None)
        @given(data=st.data())
        def test_adversarial_class(spec, dtype, cls, data):
            case = data.draw(RECORD.module("strategies").CLASSES[cls](dtype=dtype))
            check_all(spec, RECORD.property_names(), case)
        ''',
}


@pytest.fixture
def scale_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pkg = tmp_path / "fc_scale"
    pkg.mkdir()
    for name, text in SKELETON.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    # The one registry line (in flashcheck/families.py's FAMILY_RECORDS for a real family):
    record = families.Family("scale", strategies="fc_scale.strategies", properties="fc_scale.properties",
                             property_sets=("CORE_PROPERTIES",), oracle="fc_scale.oracle:scale_oracle",
                             bound="fc_scale.oracle:scale_bound", length_input="x", suite_dir=str(pkg))
    monkeypatch.setitem(families.FAMILY_RECORDS, "scale", record)
    # Its spec type (`registry.family_spec` in its kernel file for a real family): "scale" declares
    # nothing of its own, so the base KernelSpec.
    monkeypatch.setitem(registry.SPEC_TYPES, "scale", registry.KernelSpec)
    import fc_scale.kernel as k

    good = registry.KernelSpec(name="scale_ref", family="scale", fn=k.scale, dtypes=(torch.float32,))
    bad = registry.KernelSpec(name="scale_wrong", family="scale", fn=k.scale_wrong, dtypes=(torch.float32,))
    monkeypatch.setattr(registry, "REGISTRY", [*registry.REGISTRY, good])
    yield record, good, bad, pkg
    # forgotten for good (monkeypatch would restore what it deleted): the next test's copy is its own
    for mod in [m for m in sys.modules if m == "fc_scale" or m.startswith("fc_scale.")]:
        del sys.modules[mod]
    for key in [key for key in PROPERTIES if key[0] == "scale"]:
        del PROPERTIES[key]


def test_a_third_family_is_picked_up_from_its_record(scale_family) -> None:
    from hypothesis import find

    from flashcheck.families import suite_paths
    from flashcheck.properties.runner import check

    record, good, bad, pkg = scale_family
    assert "scale" in families.names()
    assert str(pkg / "test_scale.py") in suite_paths("scale")  # the suite's file list finds its module
    load_properties()  # the engine imports its properties module from the record
    assert ("scale", "matches_oracle") in PROPERTIES and record.property_names() == ("matches_oracle",)
    case = find(record.module("strategies").CLASSES["benign"](dtype=torch.float32),
                lambda c: bool((c.tensors["x"].abs() > 1).any()))
    check(good, "matches_oracle", case, save=False)  # check() runs its property ...
    with pytest.raises(AssertionError, match="differ from 2 x"):  # ... which can fail
        check(bad, "matches_oracle", case, save=False)


def test_a_third_familys_suite_runs_under_the_plugin(scale_family) -> None:
    """The plugin parametrizes the skeleton's suite module over its registered kernel and dtypes,
    and takes `--family scale` (its choices are the registry's)."""
    record, _, _, pkg = scale_family
    outcomes: dict[str, str] = {}

    class Record:
        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.when == "call":
                outcomes[report.nodeid.rsplit("::", 1)[-1]] = report.outcome

    code = pytest.main([str(pkg / "test_scale.py"), "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "--family", "scale", "--no-save-fixtures"], plugins=[Record()])
    assert code == 0 and outcomes == {"test_adversarial_class[scale_ref-fp32-benign]": "passed"}, outcomes
