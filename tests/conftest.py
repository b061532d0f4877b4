import inspect
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


def line_of(marker: str, depth: int = 1) -> int:
    """The line of the caller's file that carries the comment ``# <marker>``."""
    frame = inspect.stack()[depth]
    with open(frame.filename) as fh:
        for i, line in enumerate(fh, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return i
    raise LookupError(marker)


try:  # the same hypothesis examples on every run, here and in CI: no random flakes
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("gradsan", derandomize=True, deadline=None)
    _hyp_settings.load_profile("gradsan")
except ImportError:  # pragma: no cover
    pass
