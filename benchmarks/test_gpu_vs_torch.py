"""The CUDA provider (CUDA graphs on, device-resident I/O through IOBinding) against PyTorch
eager on the same GPU, with the same architecture and the weights copied from the ONNX
initializers; torch.compile is a separate benchmark group.

Models: the GPT-2-small-like block of benchmarks/models.py (d=768, 12 heads, 2 layers) at
seq 128 (prefill) and seq 1 over a 127-position KV cache, batch 1 and 8; ResNet50 (onnx's light
model) at batch 1. Skipped without CuPy, torch or a CUDA device.

    pytest benchmarks/test_gpu_vs_torch.py --benchmark-group-by=group,param:case
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from optimized.cuda import gpu_unavailable_reason

from .models import D_MODEL, GPT2_LAYERS, HEADS, PAST, gpt2_block, gpt2_feeds, light_model

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
REASON = gpu_unavailable_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a GPU: {REASON}")
F = torch.nn.functional
CASES = ["gpt2_seq128_b1", "gpt2_seq128_b8", "gpt2_seq1_b1", "gpt2_seq1_b8", "resnet50_b1"]


def build(case: str):
    if case.startswith("gpt2"):
        seq, batch = map(int, re.match(r"gpt2_seq(\d+)_b(\d+)", case).groups())
        past = PAST if seq == 1 else 0
        return gpt2_block(seq, past=past, batch=batch), gpt2_feeds(seq, past, batch=batch)
    from .models import light_feeds

    model = light_model("resnet50")
    return model, light_feeds(model)


# PyTorch versions of the models ----------------------------------------------------------------
def gpt2_weights(model) -> dict[str, torch.Tensor]:
    """Initializers by their hint (the builder's names without the counter suffix)."""
    from onnx import numpy_helper

    return {re.sub(r"_\d+$", "", t.name): torch.from_numpy(numpy_helper.to_array(t).copy()).cuda()
            for t in model.graph.initializer}


class TorchGPT2(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.w = gpt2_weights(model)

    def _ln(self, x, hint):
        return F.layer_norm(x, (D_MODEL,), self.w[f"{hint}_gamma"], self.w[f"{hint}_beta"], 1e-5)

    def _linear(self, x, hint):
        return x @ self.w[f"{hint}_weight"] + self.w[f"{hint}_bias"]

    def forward(self, x, *past):
        mask = self.w["causal_mask"]
        presents = []
        for i in range(GPT2_LAYERS):
            q, k, v = self._linear(self._ln(x, f"h{i}_ln_1"), f"h{i}_c_attn").split(D_MODEL, dim=2)
            q, k, v = (t.unflatten(2, (HEADS, -1)).transpose(1, 2) for t in (q, k, v))
            if past:
                k, v = torch.cat([past[2 * i], k], 2), torch.cat([past[2 * i + 1], v], 2)
            presents += [k, v]
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + self._linear(context.transpose(1, 2).flatten(2), f"h{i}_c_proj")
            hidden = F.gelu(self._linear(self._ln(x, f"h{i}_ln_2"), f"h{i}_c_fc"), approximate="tanh")
            x = x + self._linear(hidden, f"h{i}_mlp_proj")
        return (self._ln(x, "ln_f"), *presents)


class TorchGraph(torch.nn.Module):
    """ResNet50 as its ONNX graph lays it out, node by node in torch.nn.functional."""

    def __init__(self, model):
        super().__init__()
        from reference import ReferenceEvaluator

        folded = _constants(model, ReferenceEvaluator(model, check=False))
        self.consts = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in folded.items()}
        self.nodes = [n for n in model.graph.node if n.output[0] not in folded]
        self.inputs = [i.name for i in model.graph.input if i.name not in folded]
        self.outputs = [o.name for o in model.graph.output]

    def forward(self, *args):
        env = dict(self.consts) | dict(zip(self.inputs, args))
        for node in self.nodes:
            attrs = {a.name: _attr(a) for a in node.attribute}
            env[node.output[0]] = _TORCH_OPS[node.op_type]([env[n] for n in node.input if n], attrs)
        return tuple(env[o] for o in self.outputs)


def _constants(model, ev) -> dict:
    """Initializers, and the weights the light model makes with ConstantOfShape."""
    from onnx import numpy_helper

    values = {k: v for k, v in ev.initial_values().items() if isinstance(v, np.ndarray)}
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in values:
            fill = numpy_helper.to_array(node.attribute[0].t) if node.attribute else np.zeros(1, np.float32)
            values[node.output[0]] = np.full(tuple(values[node.input[0]]), fill.reshape(-1)[0])
    return values


def _attr(a):
    from onnx import helper

    return helper.get_attribute_value(a)


def _pads(attrs):
    return attrs.get("pads", [0, 0, 0, 0])


def _conv(xs, a):
    p = _pads(a)
    x = F.pad(xs[0], (p[1], p[3], p[0], p[2])) if p[0] != p[2] or p[1] != p[3] else xs[0]
    pad = 0 if p[0] != p[2] or p[1] != p[3] else (p[0], p[1])
    return F.conv2d(x, xs[1], xs[2] if len(xs) > 2 else None, a.get("strides", 1), pad,
                    a.get("dilations", 1), a.get("group", 1))


def _pool(kind):
    def run(xs, a):
        p = _pads(a)
        x = F.pad(xs[0], (p[1], p[3], p[0], p[2]), value=-float("inf") if kind == "max" else 0.0)
        fn = F.max_pool2d if kind == "max" else F.avg_pool2d
        return fn(x, a["kernel_shape"], a.get("strides", 1))

    return run


_TORCH_OPS = {
    "Conv": _conv,
    "BatchNormalization": lambda xs, a: F.batch_norm(xs[0], xs[3], xs[4], xs[1], xs[2], False, 0.0,
                                                     a.get("epsilon", 1e-5)),
    "Relu": lambda xs, a: F.relu(xs[0]),
    "Sum": lambda xs, a: sum(xs[1:], xs[0]),
    "Add": lambda xs, a: xs[0] + xs[1],
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda xs, a: xs[0].mean((2, 3), keepdim=True),
    "Reshape": lambda xs, a: xs[0].reshape([int(d) if d else xs[0].shape[i]
                                            for i, d in enumerate(xs[1].tolist())]),
    "Flatten": lambda xs, a: xs[0].flatten(a.get("axis", 1)),
    "Gemm": lambda xs, a: F.linear(xs[0], xs[1] if a.get("transB") else xs[1].T, xs[2]),
    "Softmax": lambda xs, a: F.softmax(xs[0], dim=-1),
}


def torch_model(case, model):
    return TorchGPT2(model) if case.startswith("gpt2") else TorchGraph(model)


# runners ----------------------------------------------------------------------------------
# the math modes PyTorch runs by default: cuDNN convolutions on TF32
# (torch.backends.cudnn.allow_tf32), float32 matmuls without (torch.backends.cuda.matmul.allow_tf32)
def uses_tf32(case: str) -> bool:
    return case.startswith("resnet50")


def ours(model, feeds, use_tf32=False):
    import cupy

    import optimized as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=[
        ("CUDAExecutionProvider", {"enable_cuda_graph": True, "use_tf32": use_tf32})])
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_input(name, cupy.asarray(value))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cuda")

    def run():
        sess.run_with_iobinding(binding)
        return binding.get_outputs()

    return run, lambda: binding.copy_outputs_to_cpu()


def torch_runner(case, model, feeds, compiled: bool):
    module = torch_model(case, model)
    fn = torch.compile(module) if compiled else module
    args = [torch.from_numpy(v).cuda() for v in feeds.values()]
    results = {}

    def run():
        with torch.inference_mode():
            results["out"] = fn(*args)
        torch.cuda.synchronize()

    return run, lambda: [t.cpu().numpy() for t in results["out"]]


@pytest.fixture(scope="module", params=CASES)
def case(request):
    model, feeds = build(request.param)
    return request.param, model, feeds


@pytest.mark.parametrize("runtime", ["onnx-parity-cuda-graph", "torch-eager"])
def test_gpu_vs_torch_eager(benchmark, case, runtime):
    _time(benchmark, case, runtime)


def test_torch_compile(benchmark, case):
    benchmark.group = "torch.compile (reported separately)"
    _time(benchmark, case, "torch-compile")


def _time(benchmark, case, runtime):
    name, model, feeds = case
    if runtime == "onnx-parity-cuda-graph":
        run, fetch = ours(model, feeds, uses_tf32(name))
    else:
        run, fetch = torch_runner(name, model, feeds, compiled=runtime == "torch-compile")
    run()  # captures the CUDA graph / compiles, outside the timing
    benchmark.extra_info.update({"case": name, "runtime": runtime,
                                 "tf32": "conv" if uses_tf32(name) else "off"})
    benchmark.pedantic(run, rounds=50 if "seq1" in name else 20, warmup_rounds=3)
    _check(name, model, feeds, fetch())


def _check(name, model, feeds, got):
    if name.startswith("resnet50"):
        # the light ResNet-50's weights are all 0.02: its logits are equal up to rounding and a
        # softmax of logits one ulp apart is one-hot, so two GEMM libraries are compared on the
        # logits (see tests/optimized/cuda/test_plan.py)
        model = _without_final_softmax(model)
        run, fetch = ours(model, feeds, uses_tf32(name))
        run()
        got = fetch()
    run, fetch = torch_runner(name, model, feeds, compiled=False)
    run()
    for g, w in zip(got, fetch()):
        np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-2, err_msg=name)


def _without_final_softmax(model):
    last = model.graph.node[-1]
    assert last.op_type == "Softmax" and last.output[0] == model.graph.output[0].name
    cut = type(model).FromString(model.SerializeToString())
    del cut.graph.node[-1]
    cut.graph.output[0].name = last.input[0]
    del cut.graph.output[0].type.tensor_type.shape.dim[:]
    return cut
