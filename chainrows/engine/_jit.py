"""One place for the jit options of every kernel, and the compiler pipeline they use."""

from __future__ import annotations

import numba
from numba.core import ir_utils
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NopythonRewrites


@register_pass(mutates_CFG=True, analysis_only=False)
class CopyPropagation(FunctionPass):
    """Copy propagation and dead-code removal on the typed IR (``numba.core.ir_utils.simplify``,
    which Numba runs only in its ``parallel=True`` pipeline).

    Every array an inlined helper receives is a copy of a variable in the IR, and each copy of an
    array costs an atomic reference-count increment and decrement at run time; propagating the
    copies removes them (docs/decisions-engine.md "Threads": the string probe 1.43 -> 0.80 s)."""

    _name = "chainrows_copy_propagation"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        ir_utils.simplify(state.func_ir, state.typemap, state.calltypes, state.metadata)
        return True


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
