import inspect
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


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
