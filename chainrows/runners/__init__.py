"""What runs :func:`chainrows.api.run_tables` over a whole dataset: the local bulk path under a
memory budget (:mod:`chainrows.runners.bulk`) and Ray (:mod:`chainrows.runners.ray`)."""
