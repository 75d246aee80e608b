"""chainrows on a Ray cluster (``pip install 'chainrows[ray]'``): the same rows and report as
the single-process run, decided by Ray tasks (chainrows.runners.ray.job launches them).

Modules: ``source`` (locations, input checks, the per-file read), ``route`` (the group map and
the output ranges), ``tasks`` (what the tasks run), ``commit`` (staging and the atomic commit),
``cluster`` (start or join Ray), ``job`` (the driver), ``cli`` (``chainrows reassemble --ray``).
Importing this package does not import Ray; running does.
"""

from __future__ import annotations

__all__ = ["reassemble"]


def reassemble(dataset, out, options=None, *, address: str | None = None, buckets: int | None = None,
               num_cpus: int | None = None, progress: bool | None = None, **option_values):
    """Reassemble the SPEC §2 dataset at ``dataset`` into ``out/rows/`` and ``out/report/`` on Ray.

    Reading those directories' parts in file-name order gives exactly the tables of
    ``chainrows reassemble DATASET OUT`` with the same options (both sorted by rollout_id).
    ``options`` / ``option_values``: as :func:`chainrows.reassemble` (``mode="ordinary"``,
    ``plan="forest"``, ...). ``address``: None starts a local Ray (``num_cpus`` CPUs), ``"auto"``
    or ``"ray://host:port"`` joins a cluster. ``dataset`` and ``out`` are local paths (every node
    must see them at the same path) or URIs a pyarrow filesystem reads (``s3://...``).
    Returns the run's :class:`chainrows.runners.bulk.summary.Summary`. Raises
    :class:`chainrows.errors.InputError` on unusable input; a failed run commits nothing.
    """
    from chainrows.options import Options
    from chainrows.runners.ray.job import run

    return run(dataset, out, Options.of(options, **option_values), address=address, buckets=buckets,
               num_cpus=num_cpus, progress=progress)
