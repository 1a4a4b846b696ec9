"""Convolution through cuDNN (nvidia-cudnn-frontend's Python graph API): conv, bias, residual
add and ReLU as one planned cuDNN graph, executed on the session's stream with its workspace
from the plan, so it captures into a CUDA graph (measured with cudnn-frontend 1.32: planned
graphs capture; fused ReLU has an engine only with channels-last strides).

UNTESTED ON A GPU. Written from cudnn-frontend's documented Python API (pygraph, tensor,
conv_fprop, bias, add, relu, build_operation_graph, create_execution_plans, check_support,
build_plans, get_workspace_size, execute with a handle).

Its output stays channels-last (Spec.layout NHWC), so consecutive convolutions pass activations
NHWC; the planned run copies a channels-last value to (n, c, h, w) once for any other reader.
An (n, c, h, w) input is copied channels-last first; weights that are initializers are laid out
once. `channels_last_twin` makes the same decisions over numpy for the fake device, so the
layout handling is tested on the CPU. Without the package, or for what it does not take, the
planner answers with a reason and the im2col + cuBLAS path runs.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .launches import NHWC, Planned, Spec
from .raw_kernels import RawSpec


def cudnn_planner(device):
    """A planner for `device`'s stream, or None when nvidia-cudnn-frontend is not usable; one
    cuDNN handle per device and math mode in the process."""
    key = (device.device_id, device.use_tf32)
    if key not in _PLANNERS:
        _PLANNERS[key] = _make_planner(device)
    return _PLANNERS[key]


_PLANNERS: dict = {}


def _make_planner(device):
    try:
        import cudnn

        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=device.stream.ptr)
    except Exception:  # noqa: BLE001 - missing wheel, cuDNN library or a version mismatch
        return None
    types = {np.dtype(np.float32): cudnn.data_type.FLOAT, np.dtype(np.float16): cudnn.data_type.HALF}

    def plan(x, w, b, z, y, strides, dilations, begin, end, group, activation):
        reason = declines(device, x, begin, end, group, activation, np.dtype(x.dtype) in types)
        if reason:
            return reason
        io = types[np.dtype(x.dtype)]
        compute = cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=compute,
                              compute_data_type=compute, handle=handle)
        X = graph.tensor(name="X", dim=list(x.shape), stride=_nhwc_strides(x.shape), data_type=io)
        W = graph.tensor(name="W", dim=list(w.shape), stride=_nhwc_strides(w.shape), data_type=io)
        out = graph.conv_fprop(image=X, weight=W, padding=list(begin), stride=list(strides),
                               dilation=list(dilations))
        tensors = {"X": X, "W": W}
        if b is not None:
            c = y.shape[1]
            B = graph.tensor(name="B", dim=[1, c, 1, 1], stride=[c, 1, c, c], data_type=io)
            out = graph.bias(name="bias", input=out, bias=B)
            tensors["B"] = B
        if z is not None:
            Z = graph.tensor(name="Z", dim=list(y.shape), stride=_nhwc_strides(y.shape), data_type=io)
            out = graph.add(name="residual", a=out, b=Z)
            tensors["Z"] = Z
        if activation == "Relu":
            out = graph.relu(name="relu", input=out)
        out.set_output(True).set_data_type(io)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        layout = _Layout(x, w, z, graph.get_workspace_size())

        def bind(a, o, s):
            x_l, z_l, w_l, launches = layout.inputs(a, s, device)
            pack = {tensors["X"]: x_l, tensors["W"]: w_l, out: o[0]}
            if b is not None:
                pack[tensors["B"]] = a[2]
            if z is not None:
                pack[tensors["Z"]] = z_l
            workspace = s[layout.workspace]  # the graph runs on the handle's stream
            return launches + [lambda: graph.execute(pack, workspace, handle=handle)]

        return Planned([Spec(y.shape, y.dtype, layout=NHWC)], bind, layout.scratch)

    return plan


def declines(device, x, begin, end, group, activation, supported_dtype: bool) -> str | None:
    """Why the channels-last path does not take a convolution (None: it does)."""
    if list(begin) != list(end) or group != 1 or activation not in ("", "Relu"):
        return "cuDNN path: symmetric pads, group 1, no activation or Relu"
    if not supported_dtype:
        return f"cuDNN path: dtype {x.dtype}"
    if np.dtype(x.dtype) == np.float32 and not device.use_tf32:
        return "cuDNN runs float32 convolutions on TF32 engines and use_tf32 is off"
    return None


class _Layout:
    """Where a channels-last convolution reads its inputs: a channels-last input as it is, an
    (n, c, h, w) one through a scratch copy made each run; weights that are initializers are
    copied once, into their own buffer, when the step is bound."""

    def __init__(self, x: Spec, w: Spec, z: Spec | None, workspace_bytes: int):
        self.scratch = [Spec((max(1, workspace_bytes),), np.uint8)]
        self.workspace = 0
        self.w = w
        self.x_at = self._copy_of(x)
        self.z_at = self._copy_of(z) if z is not None else None
        self.w_at = None if w.constant else self._copy_of(w)

    def _copy_of(self, v: Spec):
        if v.layout == NHWC:
            return None
        self.scratch.append(Spec(_nhwc(v.shape), v.dtype))
        return len(self.scratch) - 1

    def inputs(self, a, s, device):
        """(x, z, w) channels-last, and the launches copying them there."""
        launches = []

        def channels_last(k, at):
            if at is None:
                return a[k]
            dest, source = s[at], a[k]
            launches.append(lambda: device.xp.copyto(dest, source.transpose(0, 2, 3, 1)))
            return dest

        x_l = channels_last(0, self.x_at)
        z_l = channels_last(3, self.z_at) if len(a) > 3 and a[3] is not None else None
        if self.w_at is not None:
            w_l = channels_last(1, self.w_at)
        else:  # an initializer: laid out now, once
            w_l = device.empty(_nhwc(self.w.shape), self.w.dtype)
            with getattr(device, "stream", None) or contextlib.nullcontext():
                device.xp.copyto(w_l, a[1].transpose(0, 2, 3, 1))
        return x_l, z_l, w_l, launches


def channels_last_twin(device):
    """The cuDNN path's numpy twin for the fake device: the same decisions, layouts and copies,
    the convolution itself computed by the device kernel's numpy code."""
    from .kernels import conv as conv_kernel

    def plan(x, w, b, z, y, strides, dilations, begin, end, group, activation):
        supported = np.dtype(x.dtype) in (np.dtype(np.float32), np.dtype(np.float16))
        reason = declines(device, x, begin, end, group, activation, supported)
        if reason:
            return reason
        layout = _Layout(x, w, z, 0)
        attrs = {"strides": list(strides), "dilations": list(dilations), "group": group,
                 "pads": list(begin) + list(end), "kernel_shape": list(w.shape[2:]),
                 "activation": activation}

        def twin(xv, wv, bv, zv, yv):
            result = conv_kernel(np, xv.transpose(0, 3, 1, 2), wv.transpose(0, 3, 1, 2), bv,
                                 None if zv is None else zv.transpose(0, 3, 1, 2), **attrs)
            yv[...] = result.transpose(0, 2, 3, 1)

        spec = RawSpec("conv_nhwc_twin", "", twin, None)

        def bind(a, o, s):
            x_l, z_l, w_l, launches = layout.inputs(a, s, device)
            bias = a[2] if b is not None else None
            return launches + [device.kernel(spec)(x_l, w_l, bias, z_l, o[0])]

        return Planned([Spec(y.shape, y.dtype, layout=NHWC)], bind, layout.scratch)

    return plan


def _nhwc(shape):
    n, c, h, w = shape
    return (n, h, w, c)


def _nhwc_strides(shape):
    """NCHW dims laid out channels-last."""
    _, c, h, w = shape
    return [h * w * c, 1, w * c, c]
