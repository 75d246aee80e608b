"""Arrow/Parquet/JSON in and out: schemas, dataset reading and writing, fingerprints."""
