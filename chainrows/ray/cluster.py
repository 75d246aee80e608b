"""Starting or joining Ray, and telling input errors apart from everything else Ray raises."""

from __future__ import annotations

import contextlib

from chainrows.io.errors import InputError

INSTALL_HINT = "the --ray path needs Ray Data: pip install 'chainrows[ray]'"


def import_ray():
    """``ray`` and ``ray.data``, or an ImportError that says how to install them."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return ray


@contextlib.contextmanager
def connected(address: str | None, num_cpus: int | None = None):
    """Inside: a Ray session. ``address`` None starts a local Ray (``num_cpus`` CPUs, default all)
    and stops it on leaving; ``auto`` or ``ray://host:port`` joins a running cluster (clusters of
    Ray >= 2.59 want ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` in the environment). A session
    this process already holds is used as is and left running."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    kwargs = {"include_dashboard": False, "log_to_driver": True}
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, **kwargs)
    else:
        if address.startswith("ray://"):
            kwargs = {}  # Ray Client takes no local-node options
        ray.init(address=address, **kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


def input_error_in(exc: BaseException) -> InputError | None:
    """The InputError a Ray task raised, found in the chain Ray wraps it in (RayTaskError,
    Ray Data's UserCodeException, ``__cause__``), or None."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, InputError):
            cause = getattr(e, "cause", None)  # a RayTaskError(InputError) holds the original
            return cause if isinstance(cause, InputError) else InputError(e.args[0] if e.args else str(e))
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return None
