"""XXH3-64 (xxHash v0.8 ``XXH3_64bits_withSeed``) over int32 token runs, inside Numba.

``xxh3_64_tokens(tokens, start, stop, seed)`` equals
``xxhash.xxh3_64_intdigest(tokens[start:stop].astype("<i4").tobytes(), seed)`` bit for bit, for every
length and every seed in [0, 2**64). It is an njit function, callable from other kernels;
``hash_deltas`` hashes many runs in parallel.

Input reads. The input is a whole number of little-endian int32 tokens, so its byte length is a
multiple of 4 and every offset XXH3 reads the input at is a multiple of 4 as well. A 64-bit lane is
two adjacent tokens, a 32-bit word one token. Per length class, in tokens (n):

  n == 0        len 0          no input read (secret only)
  n in 1..2     len 4..8       32-bit reads at 0 and len-4                      -> tokens 0, n-1
  n in 3..4     len 12..16     64-bit reads at 0 and len-8                      -> tokens 0, n-2
  n in 5..32    len 20..128    16-byte pairs at 16k and len-16(k+1), k < 4      -> tokens 4k, n-4(k+1)
  n in 33..60   len 132..240   16-byte pairs at 16k (k < n/4), and at len-16    -> tokens 4k, n-4
  n >= 61       len >= 244     64-byte stripes at 64k, the last one at len-64   -> tokens 16k, n-16

The one exception in XXH3, ``XXH3_len_1to3`` (byte reads at 0, len/2, len-1), needs a 1..3 byte
input and so never runs. Lanes are read with unaligned 8-byte loads straight from the token buffer
(little-endian hosts only: the import fails elsewhere), through the intrinsics ``_lane`` / ``_u32``
on a raw ``int32*``. The helpers take that pointer rather than the array: no reference counting and
no negative-index wraparound on the hot path, and ``tokens`` must be C-contiguous (a TypingError
says so otherwise).

Secret reads happen at odd byte offsets too (3 + 16k, 119 for the 129..240 class; 121 + 8k and
11 + 8k for long inputs). Short inputs (<= 240 bytes) use the default secret with the seed added
directly; those reads come from ``_K64``, a frozen table of the 64-bit little-endian word at every
byte offset of the default secret. Long inputs with seed != 0 use XXH3_initCustomSecret(seed): the
aligned 64-bit word w of the default secret plus the seed for even w, minus it for odd w. It is
never materialised in memory: aligned words are ``_K8[w] +/- seed`` on the fly (an alternating
+seed/-seed vector added to eight words of ``_K8``), and the unaligned ones (the last stripe at byte
121, the merge at byte 11) are spliced from two such vectors with shifts. With seed == 0 that is the
default secret, as XXH3 requires, so one code path serves both.

The 64x64->128 multiply of ``XXH3_mul128_fold64`` is written with 32-bit halves in uint64 (LLVM
turns it into one widening multiply). Every constant is an ``np.uint64`` and so is every shift
count: a uint64 meeting an int64 becomes a float64 in Numba.

Long inputs. Numba runs LLVM with the SLP vectoriser off, and the loop vectoriser cannot handle the
lane swap of XXH3 (``acc[i ^ 1] += data``), so the stripe loop is emitted directly as LLVM IR on
``<8 x i64>`` vectors (``_long_stripes``): per 64-byte stripe one load, one xor with the secret,
one 32x32->64 multiply (pmuludq), a pair swap and two adds; the 16 stripes of a 1 KiB block are
unrolled, then the scramble. Nothing is allocated per call.
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from chainrows.engine.chunks import even_chunks
from chainrows.engine.jit import jit
from chainrows.engine.threads import run

__all__ = ["xxh3_64_tokens", "hash_deltas"]

if sys.byteorder != "little":  # lanes are read from memory as little-endian 64-bit words
    raise ImportError("chainrows.engine.xxh3 needs a little-endian platform")

# ---- constants (np.uint64, so every expression stays uint64 in Numba) ---------------------------

_U8 = np.uint64(8)
_M32 = np.uint64(0xFFFFFFFF)
_M16 = np.uint64(0x0000FFFF0000FFFF)
_M8 = np.uint64(0x00FF00FF00FF00FF)
_B0 = np.uint64(0xFF)
_B1 = np.uint64(0xFF00)
_S15 = np.uint64(15)
_S16 = np.uint64(16)
_S24 = np.uint64(24)
_S28 = np.uint64(28)
_S29 = np.uint64(29)
_S32 = np.uint64(32)
_S33 = np.uint64(33)
_S35 = np.uint64(35)
_S37 = np.uint64(37)
_S40 = np.uint64(40)
_S49 = np.uint64(49)

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
_BITFLIP_0 = np.uint64(int(_K64[56]) ^ int(_K64[64]))  # len 0
_BITFLIP_4 = np.uint64(int(_K64[8]) ^ int(_K64[16]))  # len 4..8
_BITFLIP_9A = np.uint64(int(_K64[24]) ^ int(_K64[32]))  # len 9..16, low lane
_BITFLIP_9B = np.uint64(int(_K64[40]) ^ int(_K64[48]))  # len 9..16, high lane

_I32P = types.CPointer(types.int32)

# Helpers called with integer literals (secret offsets, token offsets) are inlined at the Numba IR
# level: a dispatcher call would specialise (and compile, and cache) one version per literal value.
_NO_LITERALS = dict(inline="always")

# ---- raw token access ----------------------------------------------------------------------------


@intrinsic
def _token_pointer(typingctx, tokens, start):
    """int32* to tokens[start]. tokens must be a C-contiguous 1-D int32 array; start is not checked."""
    if not (isinstance(tokens, types.Array) and tokens.ndim == 1 and tokens.dtype == types.int32):
        raise TypingError("xxh3: tokens must be a 1-D int32 array, got %s" % (tokens,))
    if tokens.layout != "C":
        raise TypingError("xxh3: tokens must be C-contiguous (layout 'C'), got %s" % (tokens,))
    if not isinstance(start, types.Integer):
        raise TypingError("xxh3: start must be an integer, got %s" % (start,))

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.int64)
        return builder.gep(ary.data, [idx])

    return _I32P(tokens, start), codegen


def _index_ptr(context, builder, signature, args):
    idx = context.cast(builder, args[1], signature.args[1], types.int64)
    return builder.gep(args[0], [idx])


@intrinsic
def _u32(typingctx, p, i):
    """readLE32 of token p[i], zero-extended to uint64."""
    if p != _I32P or not isinstance(i, types.Integer):
        raise TypingError("xxh3: _u32(int32*, integer)")

    def codegen(context, builder, signature, args):
        word = builder.load(_index_ptr(context, builder, signature, args), align=4)
        return builder.zext(word, ir.IntType(64))

    return types.uint64(p, i), codegen


@intrinsic
def _lane(typingctx, p, i):
    """readLE64 of tokens p[i], p[i + 1]: one unaligned 8-byte load."""
    if p != _I32P or not isinstance(i, types.Integer):
        raise TypingError("xxh3: _lane(int32*, integer)")

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(_index_ptr(context, builder, signature, args), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=4)

    return types.uint64(p, i), codegen


# ---- scalar primitives ---------------------------------------------------------------------------


@jit
def _mul128_fold64(a, b):
    """XXH3_mul128_fold64: low 64 bits of the 128-bit product a * b xor its high 64 bits."""
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
def _xxh3_avalanche(h):
    h ^= h >> _S37
    h *= _PRIME_MX1
    h ^= h >> _S32
    return h


@jit(**_NO_LITERALS)
def _mix16(p, i, sec_off, seed):
    """XXH3_mix16B: tokens p[i .. i+4] against the default secret at byte sec_off, seeded."""
    o = np.uint64(sec_off)  # unsigned index: no negative-index wraparound code
    lo = _lane(p, i) ^ (_K64[o] + seed)
    hi = _lane(p, i + 2) ^ (_K64[o + _U8] - seed)
    return _mul128_fold64(lo, hi)


# ---- length classes ------------------------------------------------------------------------------


@jit
def _hash_short(p, n, seed):
    """n <= 60 tokens (0..240 bytes): XXH3_len_0to16, XXH3_len_17to128, XXH3_len_129to240."""
    length = np.uint64(4 * n)
    if n == 0:  # XXH64_avalanche(seed ^ secret words at 56 and 64)
        h = seed ^ _BITFLIP_0
        h ^= h >> _S33
        h *= _P64_2
        h ^= h >> _S29
        h *= _P64_3
        return h ^ (h >> _S32)
    if n <= 2:  # 4..8 bytes
        # seed ^= (u64)swap32((u32)seed) << 32
        sw = ((seed & _B0) << _S24) | ((seed & _B1) << _U8) | ((seed >> _U8) & _B1) | ((seed >> _S24) & _B0)
        seed2 = seed ^ (sw << _S32)
        h = (_u32(p, n - 1) + (_u32(p, 0) << _S32)) ^ (_BITFLIP_4 - seed2)
        # XXH3_rrmbp(h, len)
        h ^= ((h << _S49) | (h >> _S15)) ^ ((h << _S24) | (h >> _S40))
        h *= _PRIME_MX2
        h ^= (h >> _S35) + length
        h *= _PRIME_MX2
        return h ^ (h >> _S28)
    if n <= 4:  # 12..16 bytes
        lo = _lane(p, 0) ^ (_BITFLIP_9A + seed)
        hi = _lane(p, n - 2) ^ (_BITFLIP_9B - seed)
        sw = ((lo & _M32) << _S32) | (lo >> _S32)  # swap64(lo)
        sw = ((sw & _M16) << _S16) | ((sw >> _S16) & _M16)
        sw = ((sw & _M8) << _U8) | ((sw >> _U8) & _M8)
        return _xxh3_avalanche(length + sw + hi + _mul128_fold64(lo, hi))
    acc = length * _P64_1
    if n <= 32:  # 17..128 bytes
        # XXH3_len_17to128: round k (k = 0; k = 1 if len > 32; 2 if len > 64; 3 if len > 96) mixes
        # input bytes 16k with secret 32k and input bytes len - 16(k+1) with secret 32k + 16.
        for k in range((n - 1) // 8 + 1):
            acc += _mix16(p, 4 * k, 32 * k, seed)
            acc += _mix16(p, n - 4 * (k + 1), 32 * k + 16, seed)
        return _xxh3_avalanche(acc)
    # 129..240 bytes. XXH3_MIDSIZE_STARTOFFSET = 3, XXH3_MIDSIZE_LASTOFFSET = 17, secret min 136.
    for k in range(8):
        acc += _mix16(p, 4 * k, 16 * k, seed)
    acc = _xxh3_avalanche(acc)
    acc_end = _mix16(p, n - 4, 136 - 17, seed)
    for k in range(8, n // 4):
        acc_end += _mix16(p, 4 * k, 16 * (k - 8) + 3, seed)
    return _xxh3_avalanche(acc + acc_end)


def _long_stripes_codegen(context, builder, signature, args):
    """LLVM IR for the stripe loop of XXH3_hashLong_64b, the 8 accumulators in one <8 x i64>.

    Per 64-byte stripe s of a block (16 tokens, one unaligned <8 x i64> load):
        key = customSecret[8 s .. 8 s + 64]      (words s .. s+7 of _K8, +/- seed alternating)
        dk  = data ^ key
        acc += swap_pairs(data) + (dk & 0xFFFFFFFF) * (dk >> 32)
    After the 16 stripes of every full 1 KiB block: acc = (acc ^ acc >> 47 ^ customSecret[128:192])
    * PRIME32_1. Then the n_rest (< 16) stripes of the partial block, and the last stripe: input at
    token last_off, secret at byte 121 (= word 15 shifted down a byte, spliced with word 16).
    Keys are rebuilt from _K8 and the seed on every call (LLVM hoists them out of the loop); the
    custom secret is never stored and nothing is allocated.

    Over 90 lines on purpose: one IR loop nest whose blocks and phis refer to each other, read top down.
    """
    p, n_blocks, n_rest, last_off, seed = args
    i32 = ir.IntType(32)
    i64 = ir.IntType(64)
    v8 = ir.VectorType(i64, 8)
    zero32 = ir.Constant(i32, 0)

    def const(x):
        return ir.Constant(i64, int(x))

    def splat(x):
        return ir.Constant(v8, [const(x)] * 8)

    def lanes_mask(idx):
        return ir.Constant(ir.VectorType(i32, 8), [ir.Constant(i32, k) for k in idx])

    def load_v8(ptr, align):
        return builder.load(builder.bitcast(ptr, v8.as_pointer()), align=align)

    k8_type = ir.ArrayType(i64, 24)
    k8_global = cgutils.global_constant(builder, "xxh3_k8", ir.Constant(k8_type, [const(x) for x in _K8]))
    k8 = builder.gep(k8_global, [zero32, zero32])  # i64*
    undef8 = ir.Constant(v8, ir.Undefined)
    seed_v = builder.insert_element(undef8, seed, zero32)
    neg_v = builder.insert_element(undef8, builder.sub(const(0), seed), zero32)
    sign_even = builder.shuffle_vector(seed_v, neg_v, lanes_mask([0, 8] * 4))  # +s, -s, +s, ...
    sign_odd = builder.shuffle_vector(seed_v, neg_v, lanes_mask([8, 0] * 4))  # -s, +s, -s, ...

    def key_at(w, sign):  # custom secret words w .. w+7
        return builder.add(load_v8(builder.gep(k8, [w]), 8), sign)

    def stripe_at(base, s):  # 16 tokens from base + 16 s
        return load_v8(builder.gep(base, [builder.mul(s, const(16))]), 4)

    swap = lanes_mask([k ^ 1 for k in range(8)])
    mask32 = splat(0xFFFFFFFF)
    sh32 = splat(32)

    def accumulate(acc, d, key):
        dk = builder.xor(d, key)
        prod = builder.mul(builder.and_(dk, mask32), builder.lshr(dk, sh32))
        return builder.add(acc, builder.add(builder.shuffle_vector(d, undef8, swap), prod))

    scramble_key = key_at(const(16), sign_even)

    def scramble(acc):
        x = builder.xor(acc, builder.lshr(acc, splat(47)))
        return builder.mul(builder.xor(x, scramble_key), splat(_P32_1))

    keys = [key_at(const(w), sign_odd if w & 1 else sign_even) for w in range(16)]
    init_accs = (_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1)  # XXH3_INIT_ACC
    init = ir.Constant(v8, [const(x) for x in init_accs])

    entry = builder.block
    block_head = builder.append_basic_block("xxh3.block.head")
    block_body = builder.append_basic_block("xxh3.block.body")
    rest_head = builder.append_basic_block("xxh3.rest.head")
    rest_body = builder.append_basic_block("xxh3.rest.body")
    done = builder.append_basic_block("xxh3.stripes.done")
    builder.branch(block_head)

    # Full blocks: 16 stripes unrolled, then the scramble.
    builder.position_at_end(block_head)
    blk = builder.phi(i64, name="block")
    acc = builder.phi(v8, name="acc")
    blk.add_incoming(const(0), entry)
    acc.add_incoming(init, entry)
    builder.cbranch(builder.icmp_signed("<", blk, n_blocks), block_body, rest_head)

    builder.position_at_end(block_body)
    base = builder.gep(p, [builder.mul(blk, const(256))])
    a = acc
    for w in range(16):
        a = accumulate(a, stripe_at(base, const(w)), keys[w])
    a = scramble(a)
    blk.add_incoming(builder.add(blk, const(1)), block_body)
    acc.add_incoming(a, block_body)
    builder.branch(block_head)

    # The partial block: n_rest < 16 stripes, no scramble.
    builder.position_at_end(rest_head)
    s = builder.phi(i64, name="stripe")
    acc2 = builder.phi(v8, name="acc")
    s.add_incoming(const(0), block_head)
    acc2.add_incoming(acc, block_head)
    base = builder.gep(p, [builder.mul(n_blocks, const(256))])
    builder.cbranch(builder.icmp_signed("<", s, n_rest), rest_body, done)

    builder.position_at_end(rest_body)
    sign = builder.select(builder.trunc(s, ir.IntType(1)), sign_odd, sign_even)
    a = accumulate(acc2, stripe_at(base, s), key_at(s, sign))
    s.add_incoming(builder.add(s, const(1)), rest_body)
    acc2.add_incoming(a, rest_body)
    builder.branch(rest_head)

    # The last stripe, ending at the input's end, against the secret at byte 192 - 64 - 7 = 121.
    builder.position_at_end(done)
    key_lo = key_at(const(15), sign_odd)
    key_hi = key_at(const(16), sign_even)
    key = builder.or_(builder.lshr(key_lo, splat(8)), builder.shl(key_hi, splat(56)))
    d = load_v8(builder.gep(p, [last_off]), 4)
    a = accumulate(acc2, d, key)

    # XXH3_mergeAccs xors acc[i] with the secret at byte 11 + 8 i = 8 (i + 1) + 3: words i + 1 and
    # i + 2 spliced, 3 bytes / 5 bytes.
    key_lo = key_at(const(1), sign_odd)
    key_hi = key_at(const(2), sign_even)
    a = builder.xor(a, builder.or_(builder.lshr(key_lo, splat(24)), builder.shl(key_hi, splat(40))))
    return context.make_tuple(
        builder, signature.return_type, [builder.extract_element(a, ir.Constant(i32, k)) for k in range(8)]
    )


@intrinsic
def _long_stripes(typingctx, p, n_blocks, n_rest, last_off, seed):
    """The 8 accumulators of XXH3_hashLong_64b after every stripe, each already xored with its
    merge secret word (bytes 11 + 8 i), ready for the mul128 folds of XXH3_mergeAccs.

    p points at the first token; n_blocks full 1 KiB blocks, n_rest (< 16) stripes of the partial
    block, last_off the token offset of the final stripe; seed the uint64 seed (0: default secret).
    """
    if p != _I32P:
        raise TypingError("xxh3: _long_stripes needs an int32*")
    sig = types.UniTuple(types.uint64, 8)(_I32P, types.int64, types.int64, types.int64, types.uint64)
    return sig, _long_stripes_codegen


@jit
def _hash_long(p, n, seed):
    """n >= 61 tokens (> 240 bytes): XXH3_hashLong_64b_withSeed, 192-byte secret."""
    nbytes = 4 * n
    n_blocks = (nbytes - 1) // 1024
    n_rest = ((nbytes - 1) - 1024 * n_blocks) // 64
    a0, a1, a2, a3, a4, a5, a6, a7 = _long_stripes(
        p, np.int64(n_blocks), np.int64(n_rest), np.int64(n - 16), seed
    )
    # XXH3_mergeAccs (the xor with the secret at byte 11 is done by _long_stripes), start len * PRIME64_1.
    r = np.uint64(nbytes) * _P64_1
    r += _mul128_fold64(a0, a1)
    r += _mul128_fold64(a2, a3)
    r += _mul128_fold64(a4, a5)
    r += _mul128_fold64(a6, a7)
    return _xxh3_avalanche(r)


# ---- public kernels ------------------------------------------------------------------------------


@jit
def xxh3_64_tokens(tokens, start, stop, seed):
    """XXH3-64 of tokens[start:stop] read as little-endian int32 bytes, with a uint64 seed.

    Equals xxhash.xxh3_64_intdigest(tokens[start:stop].astype("<i4").tobytes(), seed). tokens: a
    C-contiguous 1-D int32 array; 0 <= start <= stop <= len(tokens) is the caller's contract and is
    not checked. Allocates nothing; callable from other njit kernels.
    """
    s = np.uint64(seed)
    n = np.int64(stop) - np.int64(start)
    p = _token_pointer(tokens, start)
    if n > 60:
        return _hash_long(p, n, s)
    return _hash_short(p, n, s)


@jit
def _hash_runs(chunks, tokens, starts, stops, seeds, out):
    """out[i] = xxh3_64_tokens(tokens, starts[i], stops[i], seeds[i]) for i in chunks[0]:chunks[-1]."""
    for i in range(chunks[0], chunks[-1]):
        out[i] = xxh3_64_tokens(tokens, starts[i], stops[i], seeds[i])


def hash_deltas(tokens, starts, stops, seeds):
    """uint64 array: out[i] = xxh3_64_tokens(tokens, starts[i], stops[i], seeds[i]), on all
    threads (the engine's own hashing runs inside verify.data_checks; this is for tests and
    benchmarks). ``starts``/``stops`` int64 within ``tokens``, ``seeds`` uint64: not checked."""
    out = np.empty(len(starts), dtype=np.uint64)
    run(_hash_runs, even_chunks(len(out)), tokens, starts, stops, seeds, out)
    return out
