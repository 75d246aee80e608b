"""Starting or joining Ray, and telling input errors apart from everything else Ray raises."""

from __future__ import annotations

import contextlib
import logging

from chainrows.errors import InputError
from chainrows.runners.ray.source import ONE_LINE

INSTALL_HINT = "the --ray path needs Ray: pip install 'chainrows[ray]'"


def import_ray():
    """``ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return ray


def session_held() -> bool:
    """Whether this process already holds a Ray session (which :func:`connected` then uses as
    is): its workers are the caller's, not a chainrows run's alone."""
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@contextlib.contextmanager
def connected(address: str | None, num_cpus: int | None = None, *, worker_logs: bool = True):
    """Inside: a Ray session. ``address`` None starts a local Ray (``num_cpus`` CPUs, default all)
    and stops it on leaving; ``auto`` or ``ray://host:port`` joins a running cluster (clusters of
    Ray >= 2.59 want ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` in the environment). A session
    this process already holds is used as is and left running. ``worker_logs``: the workers' and
    raylets' output is copied to this process's stderr (Ray's ``log_to_driver``; not over Ray
    Client)."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    # Ray's INFO lines would bury chainrows' own output (the CLI hides its warnings too while a
    # job runs: chainrows.cli.ray.quiet_logs); its progress bars stay
    kwargs = {"include_dashboard": False, "log_to_driver": worker_logs, "logging_level": logging.WARNING}
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, **kwargs)
    else:
        if address.startswith("ray://"):
            kwargs = {"logging_level": logging.WARNING}  # Ray Client takes no local-node options
        ray.init(address=address, **kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


def input_error_in(exc: BaseException) -> InputError | None:
    """The InputError a Ray task raised, found in the chain Ray wraps it in (RayTaskError,
    ``cause``, ``__cause__``, ``__context__``), or None. A wrapper
    may append a note to its args; the message the task saw is kept in an attribute (set where
    the task raised it, chainrows.runners.ray.source), else the shortest text found is taken."""
    seen, todo, found = set(), [exc], []
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, InputError):
            found.append(getattr(e, ONE_LINE, None) or str(e.args[0] if e.args else e))
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return InputError(min(found, key=len)) if found else None
