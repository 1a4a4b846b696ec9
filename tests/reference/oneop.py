"""Helpers for tests that run one operator: build a one-node model, run it through the reference
evaluator, compare exactly."""
import numpy as np
import onnx
from onnx import helper

from reference import ReferenceEvaluator
from reference.dtypes import onnx_type
from reference.registry import lookup


def one_node_model(op_type, inputs, *, n_out=1, opset=28, domain="", domain_opset=1,
                   input_types=None, ir_version=None, **attrs):
    """A model holding one node and the feeds for it.

    `inputs` are arrays, None for an absent optional input (trailing ones are dropped).
    `n_out` is a count or a list of output names, "" for a skipped optional output.
    `opset` is the default domain's; `domain_opset` that of `domain` when it is another one.
    `input_types` may give a TypeProto per input (None: a tensor typed from the array)."""
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"out{i}" for i in range(n_out)] if isinstance(n_out, int) else list(n_out)
    graph = helper.make_graph(
        [helper.make_node(op_type, names, outs, domain=domain, **attrs)],
        "t",
        [_input_info(n, v, input_types[i] if input_types else None)
         for i, (n, v) in enumerate(zip(names, inputs)) if n],
        [helper.make_empty_tensor_value_info(o) for o in outs if o],
    )
    model = helper.make_model(graph, opset_imports=_opset_ids(opset, domain, domain_opset))
    if ir_version is not None:
        model.ir_version = ir_version
    feeds = {n: v for n, v in zip(names, inputs) if n}
    return model, feeds


def run_node(op_type, *inputs, n_out=1, as_list=False, check_schema=True, opset=28, domain="",
             domain_opset=1, input_types=None, **attrs):
    """Run one node through the reference evaluator after checking it against its schema.

    Returns the only output when `n_out` is 1 (unless `as_list`), else the list of outputs.
    Graph outputs are left untyped, so only the node is checked, not the whole model."""
    model, feeds = one_node_model(op_type, inputs, n_out=n_out, opset=opset, domain=domain,
                                  domain_opset=domain_opset, input_types=input_types, **attrs)
    if check_schema:
        onnx.checker.check_node(model.graph.node[0], _checker_context(model))
    outputs = ReferenceEvaluator(model, check=False).run(None, feeds)
    return outputs[0] if n_out == 1 and not as_list else outputs


def op_function(op_type, opset=28, domain=""):
    """The reference implementation that dispatch picks for `op_type` at `opset`."""
    return lookup(domain, op_type, opset).fn


def same(actual, expected):
    """Exact dtype, shape and values (NaN == NaN)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.dtype.kind == "V":  # ml_dtypes values compare through float64, which holds them all
        actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    np.testing.assert_array_equal(actual, expected)


def arr(values, dtype=np.float32):
    return np.array(values, dtype=dtype)


def i64(*values):
    return np.array(values, dtype=np.int64)


def _input_info(name, value, type_proto):
    if type_proto is not None:
        return helper.make_value_info(name, type_proto)
    return helper.make_tensor_value_info(name, onnx_type(value.dtype), value.shape)


def _opset_ids(opset, domain, domain_opset):
    ids = [helper.make_opsetid("", opset)]
    if domain:
        ids.append(helper.make_opsetid(domain, domain_opset))
    return ids


def _checker_context(model):
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = onnx.IR_VERSION
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    return ctx
