"""Execution provider selection with onnxruntime's names and its fallback behaviour."""
from __future__ import annotations

import warnings

from .cuda.device import PROVIDER as CUDA
from .cuda.device import gpu_unavailable_reason

CPU = "CPUExecutionProvider"
KNOWN = [CUDA, CPU]
# onnxruntime's CUDA options: the first three act here, the rest are accepted and have no effect
# use_tf32: float32 GEMMs and convolutions on TF32 tensor cores (onnxruntime's default is on;
# ours is off, so float32 results agree with the reference to float32's bound unless asked)
CUDA_OPTIONS = {"device_id": 0, "enable_cuda_graph": False, "use_tf32": False}
CUDA_IGNORED = {"gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search",
                "do_copy_in_default_stream", "cudnn_conv_use_max_workspace", "tunable_op_enable",
                "prefer_nhwc"}


def select(providers=None, provider_options=None) -> tuple[list[str], dict[str, dict]]:
    """(providers really used, their options). CUDA without a usable GPU warns as onnxruntime
    does and falls back to the CPU provider, which is always last."""
    names, options = _split(providers or [CPU], provider_options)
    from .info import ALL_PROVIDERS

    unknown = [p for p in names if p not in ALL_PROVIDERS]
    if unknown:
        raise ValueError(f"unknown providers {unknown}; available: {KNOWN}")
    for name in [p for p in names if p not in KNOWN]:  # onnxruntime's, not built here
        warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                      f"Available providers: '{', '.join(KNOWN)}'", UserWarning, stacklevel=3)
    names = [p for p in names if p in KNOWN]
    chosen: dict[str, dict] = {}
    for name in names:
        if name == CUDA:
            cuda = _cuda_options(options.get(CUDA, {}))
            reason = gpu_unavailable_reason(cuda["device_id"])
            if reason is not None:
                warnings.warn(f"Specified provider '{CUDA}' is not available: {reason}. "
                              f"Falling back to '{CPU}'.", UserWarning, stacklevel=3)
                continue
            chosen[CUDA] = cuda
        else:
            chosen[name] = {}
    chosen.setdefault(CPU, {})
    return list(chosen), chosen


def _split(providers, provider_options):
    names, options = [], {}
    if provider_options is not None and len(provider_options) != len(providers):
        raise ValueError("provider_options must have one dict per provider")
    for i, p in enumerate(providers):
        name, opts = (p, {}) if isinstance(p, str) else (p[0], dict(p[1]))
        if provider_options is not None:
            opts.update(provider_options[i])
        names.append(name)
        options[name] = opts
    return names, options


def _cuda_options(given: dict) -> dict:
    unknown = set(given) - set(CUDA_OPTIONS) - CUDA_IGNORED
    if unknown:
        raise ValueError(f"unknown {CUDA} options {sorted(unknown)}; known: "
                         f"{sorted(set(CUDA_OPTIONS) | CUDA_IGNORED)}")
    return {"device_id": int(given.get("device_id", 0)),
            "enable_cuda_graph": _flag(given.get("enable_cuda_graph", False)),
            "use_tf32": _flag(given.get("use_tf32", False))}


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def as_strings(options: dict[str, dict]) -> dict[str, dict[str, str]]:
    """get_provider_options(): values as strings, as onnxruntime returns them."""
    return {p: {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in o.items()}
            for p, o in options.items()}


def make_plan(model, evaluator, options: dict[str, dict], fuse_chains: bool = False):
    """The plan for the chosen providers: the CPU plan (fusing elementwise chains when asked),
    or the device plan, planned per input-shape signature (captured in CUDA graphs when
    enable_cuda_graph is set)."""
    from .cpu import C_STEPS, KERNELS
    from .plan import Plan

    if CUDA not in options:
        return Plan(model, KERNELS, evaluator, fuse_chains=fuse_chains, c_steps=C_STEPS)
    from .cuda.arrays import CupyDevice
    from .cuda.graph_capture import GraphPlan
    from .cuda.plan import DevicePlan

    cuda = options[CUDA]
    plan = DevicePlan(model, KERNELS, evaluator, CupyDevice(cuda["device_id"], cuda["use_tf32"]))
    return GraphPlan(plan, enable_cuda_graph=cuda["enable_cuda_graph"])


def math_mode(options: dict[str, dict]) -> str:
    """The float32 math mode of the device GEMMs and convolutions, for the agreement policy:
    'tf32' (10-bit mantissa products, float32 sums) or 'fp32'."""
    cuda = options.get(CUDA)
    return "tf32" if cuda and cuda.get("use_tf32") else "fp32"
