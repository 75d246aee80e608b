"""Reading and writing NeMo Gym token captures (docs/gym.md).

``import_gym(dump, dataset)`` verifies every staged call of a Gym dump against its CallRecord
(SHA-256 digests, hashes, masks, lengths) and writes a SPEC §2 dataset whose ledger carries
each failed check in ``integrity_error``; ``export_gym`` writes raw chainrows JSON Lines as a
Gym dump. Modules: records (layout, lines), wire (byte layouts), fingerprints (output items),
verify (the checks), importer, exporter, cli.
"""

__all__ = ["GymSummary", "export_gym", "import_gym"]


def __getattr__(name):  # lazy, so the command line's parser stays free of numpy and pyarrow
    if name == "export_gym":
        from chainrows.formats.gym.exporter import export_gym

        return export_gym
    if name in ("import_gym", "GymSummary"):
        from chainrows.formats.gym import importer

        return getattr(importer, name)
    raise AttributeError(name)
