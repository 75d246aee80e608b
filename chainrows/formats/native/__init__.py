"""The native dataset (SPEC §2): its schemas, reading (checked and normalized), writing, and the
chain hash every non-oracle user computes through :func:`chainrows.formats.native.hashing.chain_hash`."""
