"""Arrow tables <-> the engine's Batch: the joins and encodings that lower the three input tables
into flat arrays (:mod:`~chainrows.lowering.columnar`, :mod:`~chainrows.lowering.joins`), row
takes (:mod:`~chainrows.lowering.take`), the rows and report tables out of the engine's arrays
(:mod:`~chainrows.lowering.output`) and their content-determined row groups
(:mod:`~chainrows.lowering.rowgroups`)."""
