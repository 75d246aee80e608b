"""The reference oracle: slow, obviously correct pure-Python readings of the contract.

- :mod:`chainrows.reference.reassembly`: SPEC §3-§5, reassembly (one function per rule);
- :mod:`chainrows.reference.calls`: SPEC §8, full-sequence call logs -> a §2 dataset.

Every kernel is tested against these. They share only the reason codes and detail texts
(chainrows.reasons) with the engine, and no code with each other's fast counterparts.
"""

from chainrows.reference.reassembly import *  # noqa: F401,F403 (the reassembly oracle's public names)
from chainrows.reference.reassembly import __all__ as _reassembly_names

__all__ = list(_reassembly_names)
