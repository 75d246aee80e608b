"""Process memory: what the process holds and hands back (:mod:`chainrows.memory.process`) and
the floor under every ``--memory-budget`` (:mod:`chainrows.memory.budget`). Base layer: no
engine, no file formats; every runner and importer may use it."""
