"""Graph rewrites for the optimized runtime: each pass is a ModelProto -> ModelProto function
that leaves a valid ONNX model (com.microsoft contrib ops for fused nodes) computing the same
outputs. `optimize` runs the passes of a level and every level below it."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import onnx

from reference.weights import SMALL_TENSOR, WeightStore, detach_initializers, is_stub

from ._graph import shared_inference, weights_into, working_copy
from .attention_fusion import fuse_attention
from .batchnorm_to_affine import batchnorm_to_affine
from .constant_folding import fold_constants
from .conv_affine_folding import fold_conv_affine
from .conv_bn_folding import fold_conv_batchnorm
from .cse import eliminate_common_subexpressions
from .dead_code import eliminate_dead_code
from .fuse_bias_activation import fuse_bias_activation
from .gate_up_halves import fuse_gate_up_halves
from .gelu_fusion import fuse_gelu
from .gqa_fusion import fuse_grouped_attention
from .identity_elimination import eliminate_identities
from .initializer_inputs import freeze_initializer_inputs
from .large_fill_folding import fold_large_fills
from .layer_norm_fusion import fuse_layer_norm
from .matmul_add_to_gemm import matmul_add_to_gemm
from .qdq_matmul_nbits import fuse_dequantize_matmul
from .rms_norm_fusion import fuse_rms_norm
from .rotary_fusion import fuse_rotary
from .silu_mlp_fusion import fuse_silu_mlp
from .weight_packing import pack_matmul_weights


class Pass(NamedTuple):
    name: str
    level: int
    function: Callable[..., onnx.ModelProto]
    uses_store: bool = False  # called with the session's WeightStore (or None) as well
    # ai.onnx op types of which the main graph must hold one for the pass to change anything
    # (each pattern it matches starts at such a node); empty: it always runs
    anchors: frozenset[str] = frozenset()
    # ai.onnx op types of which the main graph must hold each (every pattern it matches has
    # them all), so that a model without one costs the pass nothing
    requires: frozenset[str] = frozenset()
    # the rewrite helps only the CPU provider's kernels (the CUDA provider would run its nodes
    # on the host), so it runs only for a session on the CPU provider alone
    cpu_only: bool = False
    # the name of an earlier pass of the same function: this one does not run while the model
    # is still what that pass left as it was (the same bytes would give the same nothing)
    repeats: str = ""
    # it reads shapes followed through the graph (Shapes(..., data_prop=True)) and its anchors
    # are rare outside the graphs it rewrites: where it runs, every pass's shape inference
    # follows them from the start, so one inference serves each version of the graph
    # (gqa_fusion asks too, but its Softmax is in every attention graph, where the other
    # passes need no data propagation and it would cost them more)
    data_prop: bool = False


# in the order they run; the transformer fusions go before the generic ones, which would
# otherwise take apart the MatMul/scale patterns they look for
PASSES: list[Pass] = [
    Pass("initializer_inputs", 1, freeze_initializer_inputs),
    # before constant folding, which would turn the quantized weights into float ones
    Pass("qdq_matmul_nbits", 1, fuse_dequantize_matmul, anchors=frozenset({"DequantizeLinear"})),
    Pass("constant_folding", 1, fold_constants),
    Pass("large_fill_folding", 1, fold_large_fills, uses_store=True,
         anchors=frozenset({"ConstantOfShape"})),
    Pass("identity_elimination", 1, eliminate_identities),
    Pass("cse", 1, eliminate_common_subexpressions),
    Pass("dead_code", 1, eliminate_dead_code),
    Pass("layer_norm_fusion", 2, fuse_layer_norm, anchors=frozenset({"ReduceMean"}),
         requires=frozenset({"ReduceMean", "Sub", "Sqrt"})),
    Pass("rms_norm_fusion", 2, fuse_rms_norm, anchors=frozenset({"ReduceMean"})),
    Pass("gelu_fusion", 2, fuse_gelu, anchors=frozenset({"Erf", "Tanh"})),
    Pass("silu_mlp_fusion", 2, fuse_silu_mlp, anchors=frozenset({"Sigmoid"})),
    Pass("gate_up_halves", 2, fuse_gate_up_halves, anchors=frozenset({"Slice", "Split"}),
         cpu_only=True),
    Pass("attention_fusion", 2, fuse_attention, anchors=frozenset({"Softmax"}),
         requires=frozenset({"Softmax", "MatMul", "Transpose"})),
    Pass("rotary_fusion", 2, fuse_rotary, anchors=frozenset({"Neg"}), data_prop=True),
    Pass("gqa_fusion", 2, fuse_grouped_attention, anchors=frozenset({"Softmax"})),
    Pass("conv_bn_folding", 2, fold_conv_batchnorm, anchors=frozenset({"BatchNormalization"})),
    Pass("conv_affine_folding", 2, fold_conv_affine, anchors=frozenset({"Mul", "Add"}),
         requires=frozenset({"Conv"})),
    Pass("batchnorm_to_affine", 2, batchnorm_to_affine, anchors=frozenset({"BatchNormalization"})),
    Pass("matmul_add_to_gemm", 2, matmul_add_to_gemm, anchors=frozenset({"MatMul"})),
    Pass("fuse_bias_activation", 2, fuse_bias_activation,
         anchors=frozenset({"Conv", "Gemm", "MatMul"})),
    Pass("dead_code_after_fusion", 2, eliminate_dead_code, repeats="dead_code"),
    Pass("weight_packing", 99, pack_matmul_weights, uses_store=True,
         anchors=frozenset({"MatMul"}), cpu_only=True),
]


def optimize(model: onnx.ModelProto, level: int, store: WeightStore | None = None, *,
             for_cpu: bool = True) -> onnx.ModelProto:
    """The model rewritten by every pass whose level is <= `level` (0: unchanged). The passes
    rewrite one copy in place (the given model stays as it is, even when a pass fails); a pass
    whose result serializes as its input did counts as no change, so its shapes stay shared.
    With a `store`, the large initializers a pass makes move into it, and the arrays no pass
    needs any longer leave it. for_cpu=False (a session on the CUDA provider) leaves out the
    passes that only the CPU provider's kernels gain from."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"optimize expects an onnx.ModelProto, got {type(model).__name__}")
    if not isinstance(level, int) or level < 0:
        raise ValueError(f"optimization level must be an int >= 0, got {level!r}")
    if level == 0:
        return model
    with shared_inference(), weights_into(store), working_copy(model) as working:
        present = op_types(working.model)
        stored = {t.name for t in working.model.graph.initializer}
        unchanged_at: dict[str, int] = {}  # pass name -> the version it left as it was
        working.data_prop = any(p.data_prop and _runs(p, level, for_cpu, present)
                                for p in PASSES)
        for p in PASSES:
            if _runs(p, level, for_cpu, present) and not (
                    p.repeats and unchanged_at.get(p.repeats) == working.version):
                model = working.model
                rewritten = p.function(model, store) if p.uses_store else p.function(model)
                if not working.update(rewritten):
                    unchanged_at[p.name] = working.version
                else:
                    present = op_types(rewritten)
                    if store is not None:
                        stored = _store_weights(rewritten, store, stored)
        if store is not None:  # also what a pass replaced under the same name
            detach_initializers(working.model, store)
            store.retain(working.model)
        return working.model


def _runs(p: Pass, level: int, for_cpu: bool, present: set[str]) -> bool:
    """Whether pass `p` runs on a model whose main graph holds the op types `present`."""
    return (p.level <= level and (for_cpu or not p.cpu_only)
            and not (p.anchors and p.anchors.isdisjoint(present))
            and p.requires <= present)


def _store_weights(model: onnx.ModelProto, store: WeightStore, before: set[str]) -> set[str]:
    """After a pass: the large initializers it made outside the store move into it, and the
    arrays of those it dropped leave it. Returns the initializer names now."""
    initializers = model.graph.initializer
    now = {t.name for t in initializers}
    made = now - before
    if made and any(t.name in made and not is_stub(t) and math.prod(t.dims) > SMALL_TENSOR
                    for t in initializers):
        detach_initializers(model, store)
    if before - now:
        store.retain(model)
    return now


def op_types(model: onnx.ModelProto) -> set[str]:
    """The ai.onnx op types of the main graph's nodes."""
    return {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}


__all__ = ["PASSES", "Pass", "op_types", "optimize"]
