"""Copy runs of values with non-temporal (streaming) stores, inside Numba kernels.

``stream_copy(dst, d0, src, s0, n)`` does ``dst[d0:d0 + n] = src[s0:s0 + n]`` for 1-D arrays of
one integer or float dtype, ``dst`` writable, the two ranges not overlapping: the bytes before
the first 64-byte boundary of the destination and after the last one are copied one by one,
the whole cache lines between with 64-byte vector stores marked ``!nontemporal``. Bits are
copied as they are (float NaN payloads included). ``store_fence()`` orders those stores before
anything the thread writes afterwards (``sfence`` on x86-64, where a sequentially consistent
``fence`` alone compiles to a locked instruction, which Intel does not document as ordering
streaming stores; the ``fence`` too, everywhere): a kernel that streams calls it once before it
returns, so the values are in memory when another thread (or Python) reads them.

Why: a store to a line not in cache first reads the line (read for ownership). Row buffers of
a large batch are written once and are in memory, not in cache, by the time anything reads
them (the Parquet encoder, a trainer), so that read is wasted traffic; streaming whole lines
skips it. Two limits keep plain stores where streaming loses (docs/decisions-engine.md
"Gather"): a run under ``STREAM_MIN_BYTES`` (its partial lines cost more than they save), and
an output under ``STREAM_MIN_OUTPUT_BYTES`` (read soon after, from cache, which streaming
would have bypassed): :func:`stream_from` gives the kernels the run length to stream from, and
:func:`copy_run` copies a run one way or the other. Targets without streaming stores ignore the
hint.

Plain-Python definition: :func:`stream_copy_py`. ``0 <= d0``, ``d0 + n <= len(dst)``, ``0 <=
s0``, ``s0 + n <= len(src)`` is the caller's contract and is not checked.

The kernels that call these helpers are cached by Numba, which recompiles a kernel when its
own file changes, not when this one does: after editing this module, clear the
``__pycache__`` of ``chainrows/engine`` (or point ``NUMBA_CACHE_DIR`` at an empty folder).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from chainrows.engine.jit import jit

STREAM_MIN_BYTES = 512  # a shorter run is copied with plain stores
STREAM_MIN_OUTPUT_BYTES = 32 << 20  # a smaller output is written with plain stores: about a last-level cache
NEVER = np.iinfo(np.int64).max  # a run length no run reaches
_X86 = platform.machine().lower() in ("x86_64", "amd64")

_LINE = 64  # bytes per streamed vector store: one whole cache line


def _emit_loop(builder, start, stop, name, body):
    """for i in range(start, stop): body(i), as IR at the builder's position."""
    i64 = ir.IntType(64)
    pre = builder.block
    head = builder.function.append_basic_block(name + ".head")
    loop = builder.function.append_basic_block(name + ".body")
    done = builder.function.append_basic_block(name + ".done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(i64)
    i.add_incoming(start, pre)
    builder.cbranch(builder.icmp_signed("<", i, stop), loop, done)
    builder.position_at_end(loop)
    body(i)
    i.add_incoming(builder.add(i, ir.Constant(i64, 1)), builder.block)
    builder.branch(head)
    builder.position_at_end(done)


def _stream_copy_codegen(context, builder, signature, args):
    dst_ty, _, src_ty, _, _ = signature.args
    i64, i32, i8 = ir.IntType(64), ir.IntType(32), ir.IntType(8)
    line = ir.VectorType(i8, _LINE)
    width = ir.Constant(i64, context.get_abi_sizeof(context.get_data_type(dst_ty.dtype)))
    dst = context.make_array(dst_ty)(context, builder, args[0])
    src = context.make_array(src_ty)(context, builder, args[2])
    d0, s0, n = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 3, 4))
    dp = builder.bitcast(builder.gep(dst.data, [d0]), i8.as_pointer())
    sp = builder.bitcast(builder.gep(src.data, [s0]), i8.as_pointer())
    nbytes = builder.mul(n, width)

    # bytes before the destination's first 64-byte boundary, whole lines, the bytes after
    misaligned = builder.and_(builder.ptrtoint(dp, i64), ir.Constant(i64, _LINE - 1))
    head = builder.and_(builder.sub(ir.Constant(i64, _LINE), misaligned), ir.Constant(i64, _LINE - 1))
    head = builder.select(builder.icmp_signed("<", nbytes, head), nbytes, head)
    lines = builder.lshr(builder.sub(nbytes, head), ir.Constant(i64, 6))
    tail = builder.add(head, builder.shl(lines, ir.Constant(i64, 6)))

    def one_byte(i):
        builder.store(builder.load(builder.gep(sp, [i]), align=1), builder.gep(dp, [i]), align=1)

    nontemporal = builder.module.add_metadata([ir.Constant(i32, 1)])

    def one_line(k):
        at = builder.add(head, builder.shl(k, ir.Constant(i64, 6)))
        values = builder.load(builder.bitcast(builder.gep(sp, [at]), line.as_pointer()), align=1)
        store = builder.store(values, builder.bitcast(builder.gep(dp, [at]), line.as_pointer()), align=_LINE)
        store.set_metadata("nontemporal", nontemporal)

    _emit_loop(builder, ir.Constant(i64, 0), head, "stream.head", one_byte)
    _emit_loop(builder, ir.Constant(i64, 0), lines, "stream.lines", one_line)
    _emit_loop(builder, tail, nbytes, "stream.tail", one_byte)
    return context.get_dummy_value()


def stream_from(output_bytes: int) -> int:
    """The run length in bytes from which a kernel writing an output of ``output_bytes``
    streams: ``STREAM_MIN_BYTES`` for an output of at least ``STREAM_MIN_OUTPUT_BYTES``, else
    ``NEVER``."""
    return STREAM_MIN_BYTES if output_bytes >= STREAM_MIN_OUTPUT_BYTES else NEVER


def _flat_numbers(ty, name):
    if not (isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C"
            and isinstance(ty.dtype, (types.Integer, types.Float))):
        raise TypingError(f"stream_copy: {name} must be a C-contiguous 1-D integer or float array, got {ty}")


@intrinsic
def stream_copy(typingctx, dst, d0, src, s0, n):
    """dst[d0:d0 + n] = src[s0:s0 + n], whole destination cache lines streamed (see the module)."""
    _flat_numbers(dst, "dst")
    _flat_numbers(src, "src")
    if not dst.mutable:
        raise TypingError(f"stream_copy: dst is read-only ({dst})")
    if dst.dtype != src.dtype:
        raise TypingError(f"stream_copy: dst and src differ in dtype ({dst.dtype}, {src.dtype})")
    if not all(isinstance(v, types.Integer) for v in (d0, s0, n)):
        raise TypingError("stream_copy: d0, s0 and n must be integers")
    return types.void(dst, d0, src, s0, n), _stream_copy_codegen


@intrinsic
def store_fence(typingctx):
    """The streamed stores before it are visible before any memory access after it."""

    def codegen(context, builder, signature, args):
        if _X86:
            sfence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                    "llvm.x86.sse.sfence")
            builder.call(sfence, [])
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@jit(inline="always")
def copy_run(dst, d0, src, s0, n, stream_bytes):
    """dst[d0:d0 + n] = src[s0:s0 + n]: streamed when the run has at least ``stream_bytes``
    (:func:`stream_from`; the kernel ends with :func:`store_fence`), else an explicit loop over
    slice views (Numba's slice assignment ran ~1.5x slower on 460-token blocks: 59-93 vs 52-59
    ms per 530 MB)."""
    if n * dst.itemsize >= stream_bytes:
        stream_copy(dst, d0, src, s0, n)
        return
    target = dst[d0:d0 + n]
    source = src[s0:s0 + n]
    for i in range(n):
        target[i] = source[i]


def stream_copy_py(dst, d0, src, s0, n) -> None:
    """Plain-Python :func:`stream_copy`."""
    dst[d0:d0 + n] = src[s0:s0 + n]
