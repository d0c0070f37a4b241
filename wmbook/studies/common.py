"""Parameter checks several studies share (the compile backend, the end-to-end blocks, a variant stack): one
definition, imported by each study, so that no study reaches into another's private helpers."""

from __future__ import annotations

from .. import variants
from ..params import Param, ParameterError, choice, integer, name_list
from ..variants.compile_ahead import check_processes

COMPILE_BACKENDS = ("auto", "inductor", "aot_eager", "eager")


def compile_backend(v, ctx):
    """`compile_backend`: auto is inductor on a GPU, aot_eager on a CPU (inductor's CPU codegen takes minutes)."""
    choice(*COMPILE_BACKENDS)(v, ctx)
    return v if v != "auto" else ("inductor" if ctx["device"].type == "cuda" else "aot_eager")


def e2e_blocks(v, ctx):
    """`e2e_blocks`: 0 is 4 blocks on a GPU, 3 on a CPU."""
    return integer(0)(v, ctx) or (4 if ctx["device"].type == "cuda" else 3)


def _compile_ahead(v, ctx):
    try:
        return check_processes(v)
    except ValueError as e:
        raise ParameterError(str(e)) from None


COMPILE_AHEAD = Param("compile_ahead", "auto", _compile_ahead, "processes that compile the ladder's compiled stacks "
                      "side by side before its timed rows, into the compile cache the rows then read; auto: on a GPU "
                      "with inductor where the workload compiles its whole denoiser (wma), as many as the host's cores "
                      "and the GPU's memory allow; 0: none, each row compiles in turn")


def variant_stack(unset: str = "auto", empty: bool = True):
    """The check of a variant-stack parameter: comma-separated names, each checked against the workload and the device
    (an unknown name lists the known ones) and resolved to its Variant (a group to its members); the word `unset`
    gives None; empty=False refuses an empty list. The RunConfig holds the Variants: nothing downstream looks a
    name up again."""

    def check(v, ctx):
        if v == unset:
            return None
        stack = name_list(v, ctx)
        if not stack and not empty:
            raise ParameterError(f"{ctx['_name']}={v!r} is not allowed; allowed values: {unset!r} or comma-separated "
                                 f"variant names")
        return tuple(variants.resolve(stack, ctx["workload"], ctx["device"]))

    return check


__all__ = ["COMPILE_AHEAD", "COMPILE_BACKENDS", "compile_backend", "e2e_blocks", "variant_stack"]
