"""File formats and importers: the native SPEC §2 dataset (:mod:`chainrows.formats.native`),
item fingerprints (:mod:`chainrows.formats.items`), raw JSON Lines
(:mod:`chainrows.formats.jsonl`), NeMo Gym dumps (:mod:`chainrows.formats.gym`) and
full-sequence call logs (:mod:`chainrows.formats.calls`)."""
