"""XXH3-64 (xxHash v0.8 ``XXH3_64bits_withSeed``) over int32 token runs, inside Numba.

``xxh3_64_tokens(tokens, start, stop, seed)`` equals
``xxhash.xxh3_64_intdigest(tokens[start:stop].astype("<i4").tobytes(), seed)`` bit for bit, for every
length and every seed in [0, 2**64). It is an njit function, callable from other kernels;
``hash_deltas`` hashes many runs in parallel.

Why tokens instead of bytes: the input is always a whole number of little-endian int32 tokens, so
its byte length is a multiple of 4, and every offset XXH3 reads the input at is then a multiple of 4
as well (checked per length class below). A 64-bit input lane is two adjacent tokens, a 32-bit lane
one token. The only byte-granular reads in XXH3 are in ``XXH3_len_1to3``, which needs a length of
1..3 bytes and so never runs here. Byte lengths per class, in tokens (n):

  n == 0          len 0          reads the secret only
  n in 1..2       len 4..8       32-bit reads at 0 and len-4                   -> tokens 0, n-1
  n in 3..4       len 12..16     64-bit reads at 0 and len-8                   -> tokens 0, n-2
  n in 5..32      len 20..128    16-byte pairs at 16k and len-16(k+1)          -> tokens 4k, n-4(k+1)
  n in 33..60     len 132..240   16-byte pairs at 16k, and len-16              -> tokens 4k, n-4
  n >= 61         len >= 244     64-byte stripes at 64k, and the last at len-64 -> tokens 16k, n-16

Secret reads, by contrast, happen at odd byte offsets (3 + 16k, 119, 121 + 8k, 11 + 8k). They come
from ``_K64``, a frozen table of the 64-bit little-endian word at every byte offset of the default
secret. For seeded long inputs XXH3 derives a custom secret (``XXH3_initCustomSecret``: each aligned
64-bit word of the default secret plus the seed at even word indices, minus it at odd ones). It is
never materialised here: aligned words are computed on the fly as ``_K8[w] +/- seed`` and the few
unaligned ones are spliced from two such words (``_secret_at``). The custom secret of seed 0 is the
default secret, so one code path serves both. Short inputs (<= 240 bytes) use the seed directly.

The 64x64->128 multiply of ``XXH3_mul128_fold64`` is done with 32-bit halves in uint64. Every
constant is an ``np.uint64`` (a uint64 meeting an int64 becomes a float64 in Numba) and every shift
count is one too.

The long-input loop keeps the eight accumulators in scalar locals. Numba ships with LLVM's SLP
vectoriser off and the loop vectoriser cannot see across the lane swap of XXH3 (``acc[i ^ 1] +=
data``), so this is scalar code; it runs at several GB/s per core (see ``tests/test_xxh3.py`` and
the module's ``_bench`` helper).
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from chainrows.engine._jit import jit, pjit

__all__ = ["xxh3_64_tokens", "hash_deltas"]

if sys.byteorder != "little":  # tokens are read as little-endian 64-bit lanes straight from memory
    raise ImportError("chainrows.engine.xxh3 needs a little-endian platform")

# ---- constants (all np.uint64 so Numba types every expression as uint64) --------------------------

_U0 = np.uint64(0)
_U8 = np.uint64(8)
_M32 = np.uint64(0xFFFFFFFF)
_S24 = np.uint64(24)
_S28 = np.uint64(28)
_S29 = np.uint64(29)
_S32 = np.uint64(32)
_S33 = np.uint64(33)
_S35 = np.uint64(35)
_S37 = np.uint64(37)
_S40 = np.uint64(40)
_S49 = np.uint64(49)
_S64 = np.uint64(64)

_P32_1 = np.uint64(0x9E3779B1)
_P32_2 = np.uint64(0x85EBCA77)
_P32_3 = np.uint64(0xC2B2AE3D)
_P64_1 = np.uint64(0x9E3779B185EBCA87)
_P64_2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P64_3 = np.uint64(0x165667B19E3779F9)
_P64_4 = np.uint64(0x85EBCA77C2B2AE63)
_P64_5 = np.uint64(0x27D4EB2F165667C5)
_PRIME_MX1 = np.uint64(0x165667919E3779F9)
_PRIME_MX2 = np.uint64(0x9FB21C651E98DF25)

# XXH3_kSecret, the 192-byte default secret (xxhash.h v0.8).
_KSECRET = np.array(
    [
        0xB8, 0xFE, 0x6C, 0x39, 0x23, 0xA4, 0x4B, 0xBE, 0x7C, 0x01, 0x81, 0x2C, 0xF7, 0x21, 0xAD, 0x1C,
        0xDE, 0xD4, 0x6D, 0xE9, 0x83, 0x90, 0x97, 0xDB, 0x72, 0x40, 0xA4, 0xA4, 0xB7, 0xB3, 0x67, 0x1F,
        0xCB, 0x79, 0xE6, 0x4E, 0xCC, 0xC0, 0xE5, 0x78, 0x82, 0x5A, 0xD0, 0x7D, 0xCC, 0xFF, 0x72, 0x21,
        0xB8, 0x08, 0x46, 0x74, 0xF7, 0x43, 0x24, 0x8E, 0xE0, 0x35, 0x90, 0xE6, 0x81, 0x3A, 0x26, 0x4C,
        0x3C, 0x28, 0x52, 0xBB, 0x91, 0xC3, 0x00, 0xCB, 0x88, 0xD0, 0x65, 0x8B, 0x1B, 0x53, 0x2E, 0xA3,
        0x71, 0x64, 0x48, 0x97, 0xA2, 0x0D, 0xF9, 0x4E, 0x38, 0x19, 0xEF, 0x46, 0xA9, 0xDE, 0xAC, 0xD8,
        0xA8, 0xFA, 0x76, 0x3F, 0xE3, 0x9C, 0x34, 0x3F, 0xF9, 0xDC, 0xBB, 0xC7, 0xC7, 0x0B, 0x4F, 0x1D,
        0x8A, 0x51, 0xE0, 0x4B, 0xCD, 0xB4, 0x59, 0x31, 0xC8, 0x9F, 0x7E, 0xC9, 0xD9, 0x78, 0x73, 0x64,
        0xEA, 0xC5, 0xAC, 0x83, 0x34, 0xD3, 0xEB, 0xC3, 0xC5, 0x81, 0xA0, 0xFF, 0xFA, 0x13, 0x63, 0xEB,
        0x17, 0x0D, 0xDD, 0x51, 0xB7, 0xF0, 0xDA, 0x49, 0xD3, 0x16, 0x55, 0x26, 0x29, 0xD4, 0x68, 0x9E,
        0x2B, 0x16, 0xBE, 0x58, 0x7D, 0x47, 0xA1, 0xFC, 0x8F, 0xF8, 0xB8, 0xD1, 0x7A, 0xD0, 0x31, 0xCE,
        0x45, 0xCB, 0x3A, 0x8F, 0x95, 0x16, 0x04, 0x28, 0xAF, 0xD7, 0xFB, 0xCA, 0xBB, 0x4B, 0x40, 0x7E,
    ],
    dtype=np.uint8,
)
assert _KSECRET.size == 192

# _K64[o] = readLE64(kSecret + o) for every byte offset o in 0..184; _K8[w] = _K64[8 w], w in 0..23.
_K64 = np.array(
    [int.from_bytes(_KSECRET[o : o + 8].tobytes(), "little") for o in range(192 - 8 + 1)], dtype=np.uint64
)
_K8 = np.ascontiguousarray(_K64[::8])
# Two 32-bit secret words used by the 4..8-byte class are folded into one 64-bit constant below.
_BITFLIP_0 = np.uint64(int(_K64[56]) ^ int(_K64[64]))  # len 0
_BITFLIP_4 = np.uint64(int(_K64[8]) ^ int(_K64[16]))  # len 4..8
_BITFLIP_9A = np.uint64(int(_K64[24]) ^ int(_K64[32]))  # len 9..16, low lane
_BITFLIP_9B = np.uint64(int(_K64[40]) ^ int(_K64[48]))  # len 9..16, high lane

# ---- primitives --------------------------------------------------------------------------------


@jit
def _u32(tokens, i):
    """Token i as an unsigned 32-bit little-endian word, zero-extended to uint64."""
    return np.uint64(np.uint32(tokens[i]))


@jit
def _lane(tokens, i):
    """readLE64 of tokens i, i+1."""
    return np.uint64(np.uint32(tokens[i])) | (np.uint64(np.uint32(tokens[i + 1])) << _S32)


@jit
def _mul128_fold64(a, b):
    """XXH3_mul128_fold64: low 64 bits of the 128-bit product xor its high 64 bits (32-bit halves)."""
    a_lo = a & _M32
    a_hi = a >> _S32
    b_lo = b & _M32
    b_hi = b >> _S32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    hi_hi = a_hi * b_hi
    cross = (lo_lo >> _S32) + (hi_lo & _M32) + lo_hi
    upper = (hi_lo >> _S32) + (cross >> _S32) + hi_hi
    lower = (cross << _S32) | (lo_lo & _M32)
    return lower ^ upper


@jit
def _xxh64_avalanche(h):
    h ^= h >> _S33
    h *= _P64_2
    h ^= h >> _S29
    h *= _P64_3
    h ^= h >> _S32
    return h


@jit
def _xxh3_avalanche(h):
    h ^= h >> _S37
    h *= _PRIME_MX1
    h ^= h >> _S32
    return h


@jit
def _rrmbp(h, length):
    """XXH3_rrmbp: rotl49 ^ rotl24 mix, used by the 4..8-byte class."""
    h ^= ((h << _S49) | (h >> np.uint64(15))) ^ ((h << _S24) | (h >> _S40))
    h *= _PRIME_MX2
    h ^= (h >> _S35) + length
    h *= _PRIME_MX2
    h ^= h >> _S28
    return h


@jit
def _bswap64(x):
    x = ((x & np.uint64(0x00000000FFFFFFFF)) << _S32) | (x >> _S32)
    x = ((x & np.uint64(0x0000FFFF0000FFFF)) << np.uint64(16)) | ((x >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF))
    x = ((x & np.uint64(0x00FF00FF00FF00FF)) << _U8) | ((x >> _U8) & np.uint64(0x00FF00FF00FF00FF))
    return x


@jit
def _bswap32(x):
    """Byte swap of the low 32 bits of x (result < 2**32)."""
    x &= _M32
    return (
        ((x & np.uint64(0xFF)) << _S24)
        | ((x & np.uint64(0xFF00)) << _U8)
        | ((x >> _U8) & np.uint64(0xFF00))
        | (x >> _S24)
    )


@jit
def _mix16(tokens, i, sec_off, seed):
    """XXH3_mix16B on tokens i..i+3 with the default secret at byte offset sec_off."""
    lo = _lane(tokens, i) ^ (_K64[sec_off] + seed)
    hi = _lane(tokens, i + 2) ^ (_K64[sec_off + 8] - seed)
    return _mul128_fold64(lo, hi)


@jit
def _custom_word(w, seed):
    """Aligned 64-bit word w of XXH3_initCustomSecret(seed) (the default secret when seed == 0)."""
    if w & 1:
        return _K8[w] - seed
    return _K8[w] + seed


@jit
def _secret_at(o, seed):
    """readLE64(customSecret(seed) + o) for any byte offset o in 0..184."""
    w = o >> 3
    r = o & 7
    lo = _custom_word(w, seed)
    if r == 0:
        return lo
    hi = _custom_word(w + 1, seed)
    sh = np.uint64(8 * r)
    return (lo >> sh) | (hi << (_S64 - sh))


# ---- length classes ------------------------------------------------------------------------------


@jit(inline="always")
def _hash_short(tokens, start, n, seed):
    """0..240 bytes (n <= 60 tokens): XXH3_len_0to16, XXH3_len_17to128, XXH3_len_129to240."""
    length = np.uint64(4 * n)
    if n == 0:
        return _xxh64_avalanche(seed ^ _BITFLIP_0)
    if n <= 2:  # 4..8 bytes
        seed2 = seed ^ (_bswap32(seed) << _S32)
        in1 = _u32(tokens, start)
        in2 = _u32(tokens, start + n - 1)
        keyed = (in2 + (in1 << _S32)) ^ (_BITFLIP_4 - seed2)
        return _rrmbp(keyed, length)
    if n <= 4:  # 12..16 bytes
        lo = _lane(tokens, start) ^ (_BITFLIP_9A + seed)
        hi = _lane(tokens, start + n - 2) ^ (_BITFLIP_9B - seed)
        acc = length + _bswap64(lo) + hi + _mul128_fold64(lo, hi)
        return _xxh3_avalanche(acc)
    acc = length * _P64_1
    if n <= 32:  # 17..128 bytes
        if n > 8:
            if n > 16:
                if n > 24:
                    acc += _mix16(tokens, start + 12, 96, seed)
                    acc += _mix16(tokens, start + n - 16, 112, seed)
                acc += _mix16(tokens, start + 8, 64, seed)
                acc += _mix16(tokens, start + n - 12, 80, seed)
            acc += _mix16(tokens, start + 4, 32, seed)
            acc += _mix16(tokens, start + n - 8, 48, seed)
        acc += _mix16(tokens, start, 0, seed)
        acc += _mix16(tokens, start + n - 4, 16, seed)
        return _xxh3_avalanche(acc)
    # 129..240 bytes: XXH3_MIDSIZE_STARTOFFSET = 3, XXH3_MIDSIZE_LASTOFFSET = 17, secret min 136.
    for k in range(8):
        acc += _mix16(tokens, start + 4 * k, 16 * k, seed)
    acc = _xxh3_avalanche(acc)
    acc_end = _mix16(tokens, start + n - 4, 136 - 17, seed)
    for k in range(8, n // 4):
        acc_end += _mix16(tokens, start + 4 * k, 16 * (k - 8) + 3, seed)
    return _xxh3_avalanche(acc + acc_end)


def _long_accumulate_codegen(context, builder, signature, args):
    """LLVM IR for the stripe loop of XXH3_hashLong_64b_withSeed, on <8 x i64> vectors.

    acc[i] lives in lane i of one <8 x i64> value; a stripe is one unaligned <8 x i64> load of 16
    tokens (little-endian: two int32 tokens are one 64-bit lane). Per stripe s (w = s % 16):
        key = custom[w .. w+8] ; dk = data ^ key
        acc += swap_pairs(data) + (dk & 0xFFFFFFFF) * (dk >> 32)      # pmuludq
    and after the 16th stripe of every full block the accumulators are scrambled with custom[16..24].
    The last stripe reads the input at token last_off and the secret at byte 121 (unaligned).
    """
    arr_t = signature.args[0]
    tokens, start, n_blocks, n_rest, last_off, seed = args
    i32 = ir.IntType(32)
    i64 = ir.IntType(64)
    v8 = ir.VectorType(i64, 8)

    def splat(x):
        return ir.Constant(v8, [ir.Constant(i64, int(x))] * 8)

    ary = context.make_array(arr_t)(context, builder, tokens)
    data = builder.gep(ary.data, [start])  # i32*, first token

    # customSecret(seed) (XXH3_initCustomSecret): aligned word w is _K8[w] + seed for even w and
    # _K8[w] - seed for odd w, i.e. the default words plus an alternating seed vector.
    zero32 = ir.Constant(i32, 0)
    k8_type = ir.ArrayType(i64, 24)
    k8_global = cgutils.global_constant(
        builder, "xxh3_k8", ir.Constant(k8_type, [ir.Constant(i64, int(x)) for x in _K8])
    )
    k8 = builder.gep(k8_global, [zero32, zero32])  # i64*
    neg = builder.sub(ir.Constant(i64, 0), seed)
    undef8 = ir.Constant(v8, ir.Undefined)
    seed_v = builder.insert_element(undef8, seed, zero32)
    neg_v = builder.insert_element(undef8, neg, zero32)

    def mask(idx):
        return ir.Constant(ir.VectorType(i32, 8), [ir.Constant(i32, k) for k in idx])

    # sign_even: (+seed, -seed, +seed, ...), the pattern of stripes starting at an even word.
    sign_even = builder.shuffle_vector(seed_v, neg_v, mask([0, 8] * 4))
    sign_odd = builder.shuffle_vector(seed_v, neg_v, mask([8, 0] * 4))

    def load_v8(ptr, align):
        return builder.load(builder.bitcast(ptr, v8.as_pointer()), align=align)

    mask32 = splat(0xFFFFFFFF)
    sh32 = splat(32)
    swap = ir.Constant(ir.VectorType(i32, 8), [ir.Constant(i32, k ^ 1) for k in range(8)])

    def accumulate(acc, d, key):
        dk = builder.xor(d, key)
        prod = builder.mul(builder.and_(dk, mask32), builder.lshr(dk, sh32))
        swapped = builder.shuffle_vector(d, ir.Constant(v8, ir.Undefined), swap)
        return builder.add(acc, builder.add(swapped, prod))

    def scramble(acc):
        x = builder.xor(acc, builder.lshr(acc, splat(47)))
        return builder.mul(builder.xor(x, scr_key), splat(_P32_1))

    def key_at(w, sign):  # custom secret words w .. w+7
        return builder.add(load_v8(builder.gep(k8, [w]), 8), sign)

    def stripe_at(base, s):  # input of stripe s counted from token pointer base
        return load_v8(builder.gep(base, [builder.mul(s, ir.Constant(i64, 16))]), 4)

    init = ir.Constant(
        v8, [ir.Constant(i64, int(x)) for x in (_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1)]
    )
    scr_key = key_at(ir.Constant(i64, 16), sign_even)
    keys = [key_at(ir.Constant(i64, w), sign_odd if w & 1 else sign_even) for w in range(16)]

    # Full blocks: 16 stripes unrolled, then the scramble.
    entry = builder.block
    bhead = builder.append_basic_block("xxh3_block_head")
    bbody = builder.append_basic_block("xxh3_block_body")
    shead = builder.append_basic_block("xxh3_stripe_head")
    sbody = builder.append_basic_block("xxh3_stripe_body")
    done = builder.append_basic_block("xxh3_stripes_done")
    builder.branch(bhead)

    builder.position_at_end(bhead)
    blk = builder.phi(i64, name="block")
    acc = builder.phi(v8, name="acc")
    blk.add_incoming(ir.Constant(i64, 0), entry)
    acc.add_incoming(init, entry)
    builder.cbranch(builder.icmp_signed("<", blk, n_blocks), bbody, shead)

    builder.position_at_end(bbody)
    base = builder.gep(data, [builder.mul(blk, ir.Constant(i64, 256))])
    a = acc
    for w in range(16):
        a = accumulate(a, stripe_at(base, ir.Constant(i64, w)), keys[w])
    a = scramble(a)
    blk.add_incoming(builder.add(blk, ir.Constant(i64, 1)), bbody)
    acc.add_incoming(a, bbody)
    builder.branch(bhead)

    # The last, partial block: n_rest < 16 stripes, no scramble.
    builder.position_at_end(shead)
    s = builder.phi(i64, name="stripe")
    acc2 = builder.phi(v8, name="acc")
    s.add_incoming(ir.Constant(i64, 0), bhead)
    acc2.add_incoming(acc, bhead)
    base = builder.gep(data, [builder.mul(n_blocks, ir.Constant(i64, 256))])
    builder.cbranch(builder.icmp_signed("<", s, n_rest), sbody, done)

    builder.position_at_end(sbody)
    odd = builder.trunc(s, ir.IntType(1))
    a = accumulate(acc2, stripe_at(base, s), key_at(s, builder.select(odd, sign_odd, sign_even)))
    s.add_incoming(builder.add(s, ir.Constant(i64, 1)), sbody)
    acc2.add_incoming(a, sbody)
    builder.branch(shead)

    acc = acc2
    builder.position_at_end(done)
    d = load_v8(builder.gep(data, [last_off]), 4)
    # Secret at byte 121 = 8 * 15 + 1: word 15 + i shifted down a byte, word 16 + i shifted up 7.
    lo = key_at(ir.Constant(i64, 15), sign_odd)
    hi = key_at(ir.Constant(i64, 16), sign_even)
    key = builder.or_(builder.lshr(lo, splat(8)), builder.shl(hi, splat(56)))
    acc4 = accumulate(acc, d, key)
    lanes = [builder.extract_element(acc4, ir.Constant(i32, k)) for k in range(8)]
    return context.make_tuple(builder, signature.return_type, lanes)


@intrinsic
def _long_accumulate(typingctx, tokens, start, n_blocks, n_rest, last_off, seed):
    """The 8 accumulators of XXH3_hashLong after all stripes (see _long_accumulate_codegen).

    tokens must be a C-contiguous 1-D int32 array; start (token index), n_blocks (full 1024-byte
    blocks), n_rest (stripes of the partial block, < 16), last_off (token offset of the last stripe
    from start) are int64, seed the uint64 seed.
    """
    if not (isinstance(tokens, types.Array) and tokens.ndim == 1 and tokens.dtype == types.int32):
        raise TypingError("xxh3: tokens must be a 1-D int32 array")
    if tokens.layout != "C":
        raise TypingError("xxh3: tokens must be C-contiguous (layout 'C'), got layout %r" % tokens.layout)
    sig = types.UniTuple(types.uint64, 8)(tokens, types.int64, types.int64, types.int64, types.int64, types.uint64)
    return sig, _long_accumulate_codegen


@jit(inline="always")
def _hash_long(tokens, start, n, seed):
    """> 240 bytes (n >= 61 tokens): XXH3_hashLong_64b_withSeed with the 192-byte secret.

    Blocks are 16 stripes of 64 bytes (16 tokens); the last, partial block has
    ((len - 1) % 1024) // 64 stripes, then one more stripe ends exactly at the input's end.
    """
    nbytes = 4 * n
    n_blocks = (nbytes - 1) // 1024
    n_rest = ((nbytes - 1) - 1024 * n_blocks) // 64
    a0, a1, a2, a3, a4, a5, a6, a7 = _long_accumulate(
        tokens, np.int64(start), np.int64(n_blocks), np.int64(n_rest), np.int64(n - 16), seed
    )
    # XXH3_mergeAccs with the secret at byte 11 (unaligned), start len * PRIME64_1.
    r = np.uint64(nbytes) * _P64_1
    r += _mul128_fold64(a0 ^ _secret_at(11, seed), a1 ^ _secret_at(19, seed))
    r += _mul128_fold64(a2 ^ _secret_at(27, seed), a3 ^ _secret_at(35, seed))
    r += _mul128_fold64(a4 ^ _secret_at(43, seed), a5 ^ _secret_at(51, seed))
    r += _mul128_fold64(a6 ^ _secret_at(59, seed), a7 ^ _secret_at(67, seed))
    return _xxh3_avalanche(r)


# ---- public kernels ------------------------------------------------------------------------------


@jit
def xxh3_64_tokens(tokens, start, stop, seed):
    """XXH3-64 of tokens[start:stop] as little-endian int32 bytes, seeded (uint64).

    Equals xxhash.xxh3_64_intdigest(tokens[start:stop].astype("<i4").tobytes(), seed). tokens is a
    1-D int32 array; 0 <= start <= stop <= len(tokens) is the caller's contract (not checked).
    Allocates nothing.
    """
    s = np.uint64(seed)
    n = stop - start
    if n > 60:
        return _hash_long(tokens, start, n, s)
    return _hash_short(tokens, start, n, s)


@pjit
def hash_deltas(tokens, starts, stops, seeds):
    """out[i] = xxh3_64_tokens(tokens, starts[i], stops[i], seeds[i]), in parallel (uint64 array)."""
    m = starts.shape[0]
    out = np.empty(m, dtype=np.uint64)
    for i in prange(m):
        out[i] = xxh3_64_tokens(tokens, starts[i], stops[i], seeds[i])
    return out
