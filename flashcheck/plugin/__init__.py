"""flashcheck's pytest plugin (entry point `pytest11`: loaded by every pytest in an environment
where flashcheck is installed, so importing it is cheap and changes nothing).

It adds the `flashcheck` options; it adds tests to a run only when asked: `--kernel TARGET`
(`FILE.py:fn`, `package.module:fn` or a registered name) with `--family F` and no test paths runs
that family's installed suite against the kernel. Test modules of the suite set
`FAMILY` (a family's name, flashcheck/families.py); a test taking `spec` runs for every active kernel of the family,
with `dtype` for each dtype the kernel declares.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from flashcheck.kernels.registry import KernelSpec

from flashcheck import LOCAL_FIXTURE_DIR as EXTERNAL_FIXTURE_DIR, SUITE, families
from flashcheck.families import suite_paths

_ACTIVE_KEY = pytest.StashKey[bool]()
_OURS_KEY = pytest.StashKey[bool]()  # a flashcheck run: a suite, or --kernel/--family


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("flashcheck", "flashcheck: kernel checks (softmax, attention, the training families)")
    g.addoption("--kernel", dest="flashcheck_kernel", default=None, metavar="TARGET",
                help="check this kernel (FILE.py:FUNCTION, package.module:FUNCTION or a registered name) "
                     "instead of the registered ones; with no test paths, runs the family's suite")
    g.addoption("--family", dest="flashcheck_family", default=None, choices=families.names(),
                help="the kernel family: which suite runs (required with a plain function)")
    g.addoption("--kernel-dtypes", dest="flashcheck_dtypes", default=None, metavar="fp16,bf16,fp32",
                help="dtypes the kernel supports (overrides its `flashcheck` dict)")
    g.addoption("--kernel-max-n", dest="flashcheck_max_n", default=None, metavar="N",
                help="longest row / key length it supports")
    g.addoption("--kernel-min-n", dest="flashcheck_min_n", default=None, metavar="N",
                help="shortest row / key length it supports")
    g.addoption("--kernel-sizes", dest="flashcheck_sizes", default=None, metavar="N,N,...",
                help="sizes that matter to it (tiles, dispatch thresholds): lengths just below, at "
                     "and above each are drawn")
    g.addoption("--kernel-cap", dest="flashcheck_caps", action="append", default=[], metavar="KEY=VALUE",
                help="any other capability declaration (repeatable), e.g. causal=false, "
                     "head_dims=64,128, validates_input=false; see flashcheck.targets.external.CAPABILITIES")
    g.addoption("--no-save-fixtures", dest="flashcheck_no_save", action="store_true",
                help="do not write regression fixtures for shrunk failures")
    g.addoption("--fixture-dir", dest="flashcheck_fixture_dir", default=None, metavar="DIR",
                help="where regression fixtures are written and replayed from (default: the suite's "
                     f"own for registered kernels in flashcheck's checkout, ./{EXTERNAL_FIXTURE_DIR} otherwise)")
    parser.addini("flashcheck_suite_fixtures", type="bool", default=False,
                  help="flashcheck's own suite: shrunk failures of the registered kernels are written to "
                       "its flashcheck/suite/regressions (set in flashcheck's pyproject.toml; "
                       "$FLASHCHECK_SUITE_FIXTURES=0/1 overrides)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """`--kernel` with no test paths: the family's suite is the run (its conftest an initial one).

    A run of the suite against a kernel imports the suite in importlib mode: pytest's default
    (prepend) puts the folder above the suite's packages first on sys.path, in a checkout or
    editable install the root with flashcheck's kernels/, tests/, reports/, and a user's own
    `kernels.my_softmax` was then not found (issue 49)."""
    ns = early_config.known_args_namespace
    if not getattr(ns, "flashcheck_kernel", None):
        return
    # A value of an option a suite plugin adds (`--quick-first 3`) is not a test path.
    given = [p for p in ns.file_or_dir if Path(p.split("::")[0]).exists()]
    if not given:
        paths = suite_paths(getattr(ns, "flashcheck_family", None))
        args.extend(paths)
        ns.file_or_dir = [*ns.file_or_dir, *paths]
        given = paths
    if all(SUITE.resolve() in Path(p.split("::")[0]).resolve().parents for p in given) and \
            not any(a.startswith("--import-mode") for a in args):
        args.append("--import-mode=importlib")
        ns.importmode = "importlib"


def _overrides(config: pytest.Config) -> dict[str, str]:
    out: dict[str, str] = {}
    for opt, key in (("flashcheck_dtypes", "dtypes"), ("flashcheck_max_n", "max_n"),
                     ("flashcheck_min_n", "min_n"), ("flashcheck_sizes", "sizes")):
        v = config.getoption(opt)
        if v is not None:
            out[key] = v
    for item in config.getoption("flashcheck_caps"):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise pytest.UsageError(f"--kernel-cap {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _integer_overrides(raw: dict[str, str]) -> dict[str, object]:
    out: dict[str, object] = dict(raw)
    for key in ("max_n", "min_n", "block_n", "max_head_dim"):
        if key in out:
            try:
                out[key] = int(str(out[key]))
            except ValueError:
                raise pytest.UsageError(f"{key}={out[key]!r}: not an integer") from None
    return out


#: Keep only this many of the selected tests, spread evenly over them: a shortened run of any
#: command as written (CI runs the README's commands this way), never a verdict on a kernel.
SAMPLE_ENV = "FLASHCHECK_SAMPLE_TESTS"


class _Sample:
    """A sample that passes is not a verdict: it exits 5 (exitcodes.NOTHING_CHECKED), never 0, unless
    it kept every selected test; a failure in it is still a failure (1)."""

    def __init__(self, keep: int) -> None:
        self.keep, self.of = keep, 0

    @pytest.hookimpl(trylast=True)  # after -m, -k and the family filters: a sample of what they left
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        self.of = len(items)
        if len(items) <= self.keep:
            return
        step = (len(items) - 1) / max(1, self.keep - 1)
        chosen = {round(i * step) for i in range(self.keep)}
        config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i not in chosen])
        items[:] = [it for i, it in enumerate(items) if i in chosen]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # xdist's controller: the workers collected
        self.of = max(self.of, getattr(node, "workeroutput", {}).get(SAMPLE_ENV, 0))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(session.config, "workeroutput"):
            session.config.workeroutput[SAMPLE_ENV] = self.of
        elif session.exitstatus == pytest.ExitCode.OK and self.of > self.keep:
            from flashcheck.exitcodes import NOTHING_CHECKED

            session.exitstatus = NOTHING_CHECKED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        sampled = self.of > self.keep
        terminalreporter.write_line(f"flashcheck: {SAMPLE_ENV}={self.keep}: a sample of {min(self.keep, self.of)} "
                                    f"of the {self.of} selected tests ran" + (
                                        ": not a verdict (a passing sample exits 5, not 0)" if sampled else ""))


def _sample(config: pytest.Config) -> None:
    raw = os.environ.get(SAMPLE_ENV, "").strip()
    if not raw:
        return
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"{SAMPLE_ENV}={raw!r}: expected a positive number of tests")
    config.pluginmanager.register(_Sample(int(raw)), "flashcheck-sample")


def pytest_configure(config: pytest.Config) -> None:
    _sample(config)
    for name in families.names():
        config.addinivalue_line("markers", f"{name}: a test of the {name} family's suite")
    target, family = config.getoption("flashcheck_kernel"), config.getoption("flashcheck_family")
    config.stash[_ACTIVE_KEY] = bool(target or family)
    _configure_fixtures(config)
    ours = config.stash[_ACTIVE_KEY] or config.pluginmanager.hasplugin("flashcheck.plugin.tiers")
    config.stash[_OURS_KEY] = ours
    if ours:  # a run of a suite: the kernels' hooks now; an unrelated run imports no torch for them
        from flashcheck.plugin import devices
        from flashcheck.isolation import hooks as kernel_hooks
        from flashcheck.plugin import profiles

        problem = devices.interpreter_off_without_gpu()
        if problem:
            raise pytest.UsageError(problem)
        if config.stash[_ACTIVE_KEY]:
            profiles.keep_out_of_working_folder()

        kernel_hooks.attach()
    from flashcheck.isolation import journal as isolation

    if ours or isolation.enabled():
        from flashcheck.plugin import isolation as pytest_isolation  # crashes, hangs and GPU faults: one named failure each

        pytest_isolation.register(config)
    if config.stash[_ACTIVE_KEY]:
        from flashcheck.plugin import checked  # how much was checked; nothing checked is not green
        from flashcheck.plugin import progress

        checked.register(config)
        progress.register(config)  # a line as tests end, when the output is a CI log
    if not target:
        if _overrides(config):
            raise pytest.UsageError("--kernel-dtypes/--kernel-max-n/--kernel-cap declare a kernel's "
                                    "capabilities: they need --kernel")
        return
    from flashcheck.fixtures import store as fixtures
    from flashcheck.targets.external import KernelLoadError, load_kernel
    from flashcheck.kernels.registry import REGISTRY

    try:
        spec = load_kernel(target, family, overrides=_integer_overrides(_overrides(config)))
    except KernelLoadError as e:
        raise pytest.UsageError(str(e)) from None
    REGISTRY[:] = [spec]
    if spec.external:
        fixtures.configure(default_dir=Path.cwd() / EXTERNAL_FIXTURE_DIR)


def _configure_fixtures(config: pytest.Config) -> None:
    """Options into the fixtures' process state; a named --fixture-dir that cannot take fixtures is
    one line now, not an OSError in place of the first failure's message."""
    suite = bool(config.getini("flashcheck_suite_fixtures"))
    no_save, d = config.getoption("flashcheck_no_save"), config.getoption("flashcheck_fixture_dir")
    if not (suite or no_save or d):
        return  # an unrelated pytest run: import nothing heavy
    from flashcheck.fixtures import store as fixtures

    fixtures.configure(suite=suite)
    if no_save or d:
        fixtures.configure(save=not no_save, directory=Path(d).resolve() if d else None)
    if d and not no_save:
        problem = fixtures.dir_problem(Path(d))
        if problem:
            raise pytest.UsageError(f"--fixture-dir {problem}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """xdist ends a run that reached -x or --maxfail as interrupted (status 2, as after Ctrl-C)
    where pytest alone says failed (1), and `flashcheck check` read that 2 as the tool failing, not
    as the kernel's verdict. In a flashcheck run the status is pytest's own: failed."""
    config = session.config
    maxfail = config.getoption("maxfail", 0) or 0
    if (config.stash.get(_OURS_KEY, False) and exitstatus == pytest.ExitCode.INTERRUPTED and maxfail
            and session.testsfailed >= maxfail):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not config.stash.get(_ACTIVE_KEY, False):
        return None
    from flashcheck.fixtures import store as fixtures
    from flashcheck.kernels.registry import REGISTRY

    lines = []
    from flashcheck.targets.signature import describe as from_signature

    for s in REGISTRY:
        lines.append(f"flashcheck: {s.name} ({s.family}): {describe_capabilities(s)}")
        read = from_signature(s)
        if read:
            lines.append(f"flashcheck: {s.name}: read from its {read}")
    lines.append("flashcheck: --kernel/--family runs only tests that check a kernel; the suite's self-tests "
                 "are deselected")
    lines.append(f"flashcheck: fixtures {'in ' + str(fixtures.fixture_dir()) if fixtures.saving_enabled() else 'not saved'}")
    return lines


def describe_capabilities(spec: KernelSpec) -> str:
    """What the run checks of this kernel and what its declarations leave out."""
    from flashcheck.oracles.formats import format_of

    parts = [",".join(format_of(d).name for d in spec.dtypes)]
    if spec.min_n > 1 or spec.max_n:
        parts.append(f"n in [{spec.min_n}, {spec.max_n or 'any'}]")
    if spec.sizes:
        parts.append(f"sizes {list(spec.sizes)}")
    skipped = []
    if not spec.validates_input:
        skipped.append("bad-input tests")
    if spec.contiguous_only:
        skipped.append("strided layouts")
    more, more_skipped = families.get(spec.family).hook("capability_notes")(spec)
    parts += more
    skipped += more_skipped
    if spec.configs or spec.tunings:
        parts.append(f"{len(spec.configs)} configs, {len(spec.tunings)} tunings")
    return "; ".join(parts) + (f"; not checked: {', '.join(skipped)}" if skipped else "")


def _active(family: str, config: pytest.Config) -> list[KernelSpec]:
    from flashcheck.kernels.registry import REGISTRY

    wanted = config.getoption("flashcheck_family")
    if wanted and wanted != family:
        return []
    return [s for s in REGISTRY if s.family == family]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spec" not in metafunc.fixturenames:
        return
    family = getattr(metafunc.module, "FAMILY", None)
    if family is None:
        raise pytest.UsageError(f"{metafunc.module.__name__} takes `spec` but sets no FAMILY")
    from flashcheck.oracles.formats import format_of

    specs = _active(family, metafunc.config)
    if "launch" in metafunc.fixturenames:
        from flashcheck.plugin.launches import launches

        params = [(s, d, l) for s in specs for d in s.dtypes for l in launches(s)]
        ids = [f"{s.name}-{format_of(d).name}-{l.id}" for s, d, l in params]
        metafunc.parametrize(("spec", "dtype", "launch"), params, ids=ids)
    elif "dtype" in metafunc.fixturenames:
        params = [(s, d) for s in specs for d in s.dtypes]
        ids = [f"{s.name}-{format_of(d).name}" for s, d in params]
        metafunc.parametrize(("spec", "dtype"), params, ids=ids)
    else:
        metafunc.parametrize("spec", specs, ids=[s.name for s in specs])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Family markers; with --kernel or --family, only the family's kernel tests run."""
    for item in items:
        family = getattr(getattr(item, "module", None), "FAMILY", None)
        if family in families.names():
            item.add_marker(family)
    if not config.stash.get(_ACTIVE_KEY, False):
        return

    def runs_a_kernel(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        return callspec is not None and ("spec" in callspec.params or "fixture" in callspec.params)

    keep = [i for i in items if runs_a_kernel(i)]
    drop = [i for i in items if not runs_a_kernel(i)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# The oracles' float64 matrix products are small: one BLAS thread per xdist worker beats a pool
# per worker fighting over the same cores. Set before NumPy loads its BLAS (the plugin is
# imported before any test module). torch's CPU work (building inputs, copies, float64 views)
# likewise: by default every worker starts a pool as wide as the machine, and 16 workers x 16
# threads on 16 cores spent most of a GPU run's softmax time waiting on each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _share = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    import torch as _torch

    _torch.set_num_threads(_share)
