"""One place for the jit options of every kernel, and the compiler pipeline they use."""

from __future__ import annotations

import numba
from numba.core import ir, ir_utils
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NopythonRewrites


@register_pass(mutates_CFG=False, analysis_only=False)
class CopyPropagation(FunctionPass):
    """Copy propagation on the typed IR (the first half of ``numba.core.ir_utils.simplify``,
    which Numba runs only in its ``parallel=True`` pipeline), then the copies nothing reads any
    more are dropped.

    Every array an inlined helper receives is a copy of a variable in the IR, and each copy of an
    array costs an atomic reference-count increment and decrement at run time; propagating the
    copies removes them (docs/decisions-engine.md "Threads": the string probe 1.51 -> 1.05 s).
    Only plain ``a = b`` copies are removed, never a statement with an effect: Numba's general
    dead-code removal (the rest of ``simplify``) also drops writes into arrays it cannot tell
    are aliases of an argument (``out.view(...)[i] = x``)."""

    _name = "chainrows_copy_propagation"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        blocks = state.func_ir.blocks
        copies_in, _ = ir_utils.copy_propagate(blocks, state.typemap)
        names = ir_utils.get_name_var_table(blocks)
        saved = ir_utils.apply_copy_propagate(blocks, copies_in, names, state.typemap, state.calltypes)
        ir_utils.restore_copy_var_names(blocks, saved, state.typemap)
        drop_unread_copies(blocks)
        return True


def drop_unread_copies(blocks) -> None:
    """Remove every ``a = b`` (a variable copied from a variable) whose target is read nowhere in
    the function, until none is left (removing one can leave its source unread)."""
    while True:
        read = set()
        for block in blocks.values():
            for stmt in block.body:
                if not isinstance(stmt, ir.Assign):
                    read.update(v.name for v in stmt.list_vars())
                elif isinstance(stmt.value, ir.Var):
                    read.add(stmt.value.name)
                elif isinstance(stmt.value, ir.Expr):
                    read.update(v.name for v in stmt.value.list_vars())
        removed = False
        for block in blocks.values():
            keep = [stmt for stmt in block.body
                    if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Var)
                            and stmt.target.name not in read)]
            removed |= len(keep) != len(block.body)
            block.body = keep
        if not removed:
            return


class KernelCompiler(CompilerBase):
    """Numba's nopython pipeline with :class:`CopyPropagation` after its rewrites."""

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.add_pass_after(CopyPropagation, NopythonRewrites)
        pm.finalize()
        return [pm]


# cache=True: compiled kernels are written next to the source (or NUMBA_CACHE_DIR) so a second
# process starts in well under a second. error_model="numpy": division never raises, and the
# kernels avoid it on their hot paths anyway. boundscheck stays off: every offset and index is
# validated in chainrows.engine.batch before a kernel sees it.
OPTIONS = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False, pipeline_class=KernelCompiler)

# No kernel is parallel=True: the ones that split their work take chunks and run on
# several threads through chainrows.engine.threads (why: that module's docstring).


# Helpers called once per call or candidate inside a kernel's loop take inline="always" (Numba IR
# inlining): a jitted call that passes a dozen arrays costs more than the helper's body
# (docs/decisions-engine.md). Each inlined call site is compiled again, so keep those sites few.
def jit(*args, **kwargs):
    """numba.njit with the project's options."""
    return numba.njit(*args, **{**OPTIONS, **kwargs})
