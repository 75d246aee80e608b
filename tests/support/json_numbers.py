"""JSON number literals for the tests of the JSON readers' kernels (chainrows.formats.json_arrays)."""

from __future__ import annotations

import math
import random
import struct
from decimal import Decimal, getcontext

import numpy as np

INTEGERS = ("0", "-0", "16777217", "123456789012345678", "-9007199254740993")


def float_literals(rng: random.Random, n: int, integers: bool = False) -> list:
    """Number literals json.loads reads as float: reprs (17 digits), float32 reprs, short decimals,
    exponents, halfway cases, overflow and underflow; with ``integers``, integer literals too
    (``INTEGERS``: the integer -0, and integers beyond what float32 or float64 holds exactly)."""
    getcontext().prec = 800
    out = []
    while len(out) < n:
        k = rng.random()
        if k < 0.3:
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if math.isfinite(x):
                out.append(repr(x))
        elif k < 0.5:
            out.append(repr(float(np.float32(-rng.expovariate(1.0)))))
        elif k < 0.6:
            out.append(f"{rng.choice(('', '-'))}{rng.randint(0, 10**rng.randint(1, 20))}.{rng.randint(0, 10**rng.randint(1, 22))}")
        elif k < 0.7:
            out.append(f"-{rng.randint(1, 9)}.{rng.randint(0, 10**25)}{rng.choice('eE')}{rng.choice(('', '+', '-'))}{rng.randint(0, 330)}")
        elif k < 0.85:
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
            y = math.nextafter(x, math.inf)
            if math.isfinite(y) and x != 0:
                out.append(format((Decimal(x) + Decimal(y)) / 2, "e"))  # exactly halfway
        elif integers and k < 0.9:
            out.append(rng.choice(INTEGERS))
        else:
            out.append(rng.choice(("0.0", "-0.0", "0e0", "-0e5", "1e400", "-1e400", "1e-400", "5e-324",
                                   "2.4703282292062328e-324", "1.7976931348623159e308", "1e22", "1e23",
                                   "9007199254740993.0", "0.1", "1.5e-7", "123456789012345.6e-3")))
    return out
