"""File formats and importers: the native SPEC §2 dataset (:mod:`chainrows.formats.native`),
item fingerprints (:mod:`chainrows.formats.items`), raw JSON Lines
(:mod:`chainrows.formats.jsonl`) and NeMo Gym dumps (:mod:`chainrows.formats.gym`)."""
