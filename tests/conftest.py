import inspect
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

# One JAX compilation cache on disk for the whole run: the xdist workers and every subprocess
# (`gradsan run`, reproducers, the 8-device child) inherit this environment, so a program
# compiled in one process is loaded, not compiled again, in the next (`gradsan run` of the
# pairwise-distance example: 29 CPU-s cold, 9 CPU-s warm; its reproducer 21 -> 7). The same
# programs run and give the same bits; only XLA's compile is skipped. Set up before JAX is
# imported (its config reads these variables then); an existing JAX_COMPILATION_CACHE_DIR is
# kept (to reuse a cache across runs). The directory made here is removed when the run ends.
_JAX_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _JAX_CACHE = tempfile.mkdtemp(prefix="gradsan-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
    # every program, not only those that took a second to compile (most of the suite's
    # compiles are small eager ops of the interpreter's replays)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_configure(config):
    # an entry another process is still writing cannot be read (or written) yet: JAX warns and
    # compiles the program itself, which is what it would do without the cache
    for verb in ("reading", "writing"):
        config.addinivalue_line(
            "filterwarnings", f"ignore:Error {verb} persistent compilation cache entry:UserWarning"
        )
    # pytest-xdist (3.8) hands loadfile's files out sorted by their number of tests (its
    # --loadscope-reorder default), throwing pytest_collection_modifyitems' order away: a
    # one-test file such as tests/jax/test_mesh.py (~26 CPU-s) went last. Off, as
    # --no-loadscope-reorder sets it; xdist's controller reads it when it schedules. A simulation
    # of xdist's scheduler on the measured per-test CPU-s of 54 files (697 CPU-s): the two
    # workers end 1.1% over an even split in xdist's order (6.4% on a 52-file subset), 0.0% in
    # this one (notes/s15/suite.md).
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The files that hold `slow` tests run first, in their collected order, then the rest (the
    order inside each file is kept): under `-n 2 --dist loadfile` the run then ends on short
    files, so the two workers finish close together instead of one idling while the other runs
    a long subprocess file that started last. Mark a file's expensive tests `slow` and it is
    scheduled early. Needs xdist's reordering off (pytest_configure above)."""
    heavy = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in heavy)


def pytest_unconfigure(config):
    if _JAX_CACHE is not None:  # the process that made it (xdist's controller, or the only one)
        shutil.rmtree(_JAX_CACHE, ignore_errors=True)


def _marked(path: str | os.PathLike[str], marker: str) -> tuple[int, str]:
    with open(path) as fh:
        for i, line in enumerate(fh, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return i, line
    raise LookupError(f"no line ending with '# {marker}' in {path}")


def _caller_file() -> str:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None and frame.f_back.f_back is not None
    return frame.f_back.f_back.f_code.co_filename


def line_of(where: str | os.PathLike[str], marker: str | None = None) -> int:
    """The number of the line that ends with the comment ``# <marker>``: in the calling file
    for ``line_of(marker)``, in ``path`` for ``line_of(path, marker)``. Tests name lines by a
    marker, so their asserts never drift when the file changes."""
    if marker is None:
        return _marked(_caller_file(), str(where))[0]
    return _marked(where, marker)[0]


def col_of(marker: str, snippet: str) -> tuple[int, int]:
    """(column, end_column) of ``snippet`` on the line of the calling file marked ``marker``."""
    line = _marked(_caller_file(), marker)[1]
    c = line.index(snippet)
    return c, c + len(snippet)


try:  # the same hypothesis examples on every run, here and in CI: no random flakes
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("gradsan", derandomize=True, deadline=None)
    _hyp_settings.load_profile("gradsan")
except ImportError:  # pragma: no cover
    pass
