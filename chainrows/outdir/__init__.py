"""Output directories: atomic commits, the overwrite policy, locks and fsync
(:mod:`chainrows.outdir.atomic`), the one set of Parquet writer options
(:mod:`chainrows.outdir.parquet`), plain files whose failures name them
(:mod:`chainrows.outdir.outfile`) and content digests of kept files
(:mod:`chainrows.outdir.digest`). Base layer: no engine, no file formats."""
