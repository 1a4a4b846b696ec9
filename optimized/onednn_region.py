"""NHWC regions: connected groups of plan steps that run in NHWC as one step
(kernels.OneDNNRegion over csrc/onednn_region.c), transposing from and to NCHW only the values
that enter or leave the group, where per-node convolutions transpose around every node.

Members: Conv and FusedConv with constant float32 weights and bias, group 1, at least
MIN_INPUT_CHANNELS input channels and an activation with f(0) = 0 (bias, residual sum and
activation included); Relu; Add of two members' results; Concat along channels (any channel
counts: NHWC concatenates pixel by pixel); MaxPool and AveragePool without ceil mode, dilation
or auto_pad; GlobalAveragePool.  A convolution starts a region or joins its input's; the other
ops join the region of all their data inputs.  A group is planned per input shapes and thread
count on its first run; where oneDNN refuses it, its members run one by one as before.
Convolutions (1x1 included) run as oneDNN's brgconv:avx2 in NHWC, pools as an AVX2 loop over
channels, entries and exits through onednn_conv.c's 8x8-tile transposes.

When regions run (s26): ONNX_PARITY_ONEDNN_REGIONS=0 never, 1 always, "all" always and
without the rule below (tests of how regions run); unset, where kernels.isa() is "avx512" and
DEFAULT_ON_AVX512 is True (it is: the suite's passes are beside it).
The rule: a region forms only where it transposes fewer values (channels x pixels) at its
entries and exits than its members would one by one, where only the convolutions
onednn_conv.toml gives oneDNN transpose (their input and output) and ours (1x1, depthwise,
grouped, RGB stem) and the other members read NCHW.  Without it (s26, 2-core AVX-512 Zen 4,
1 thread, CPU ms, plain / regions) light_densenet121 lost 65.6 / 71.6 and 64.7 / 74.8: 59 of
its 61 regions are a 1x1 then a 3x3 whose entry is the 1x1's 160-1024 channel input, where one
by one only the 3x3's 128 in and 32 out are transposed; mobilenet_v3_small lost 0.84 / 0.97
and 0.85 / 0.92: its 2 regions are pairs of 1x1 convolutions (ours, no transposes one by one).
With the rule densenet keeps 2 regions (its first two layers: 64 and 96 channels in),
mobilenet and shufflenet none, resnet50, inception_v2, squeezenet and vgg19 their one each.
Measured with the rule (one process each timing a session's run() by process CPU time over
RUNS runs after 5 warm-ups, ONNX_PARITY_ONEDNN_REGIONS=0 / 1 alternated, 3 rounds, median CPU ms per run, load 3-7):
1 thread: light_resnet50 84.2 / 81.0 (0.96); light_inception_v2 41.1 / 40.7 (0.99);
light_squeezenet 7.76 / 7.79 (1.00); light_vgg19 379 / 365 (0.96); light_densenet121
64.7 / 64.8 (1.00); light_shufflenet and mobilenet_v3_small run the same plan either way
(no region formed).  2 threads (load 3-3.5, indicative), wall ms: resnet50 62.7 / 67.5 (one
round each of 3 was taken by the load: 119 / 163), inception_v2 21.4 / 20.3, squeezenet
7.31 / 6.15.  Again, 4 rounds at load 1.7-2.2: squeezenet 7.64 / 8.48 (paired rounds
1.00-1.02, one 1.20), densenet121 64.2 / 65.3 (1.01-1.02); 5 rounds at load 1.2-3.3:
squeezenet 7.80 / 8.19 (1.05), densenet121 66.3 / 64.5 (0.97), inception_v2 40.6 / 38.8
(0.96).  squeezenet's region loses at 1 thread (median paired round 1.02): in a profile
(benchmarks.sessions light_squeezenet 1 20) its convolutions took 8.6 ms in the region against
13.1 one by one, but its Concat copies (with the expand convolutions' Relu) 2.2 ms, in place
one by one, and its NHWC MaxPools 0.70 ms against 0.36 (our NCHW kernel); a faster region
pool and a Concat written in place would be the next steps.  These per-process figures alone
kept regions off; the suite's passes (DEFAULT_ON_AVX512's comment, benchmarks/RESULTS.md)
turned them on.

Before s26 (AVX2 machines), off by default: ONNX_PARITY_ONEDNN_REGIONS=1 turned regions on.
Measured at 1 thread on the 2-core AVX2 EPYC, load 2.7-4 (other work), one process, sessions with regions / without
alternated, medians of 21 (9) rounds of 5 runs, CPU ms: light_squeezenet 10.11 / 9.62 (1.05),
light_inception_v2 58.9 / 59.1 (1.00); 7 rounds: light_densenet121 83.6 / 78.7 (1.06),
light_resnet50 106.3 / 118.4 (0.90; again 0.97); 5 rounds: light_vgg19 513 / 508 (1.01).  The
2-thread runs under that load were noise (0.95 and 1.55).  Mixed, so still not the default.  Inside a squeezenet region (CPU ms per run, counted op by
op): 3x3 convolutions 5.6, 1x1 convolutions 4.9, Concat copies 0.5, pools 0.3, entries 0.1.
Tried and dropped: 1x1 as our packed GEMM over NHWC pixels (gemm_packed_f32, bias and
activation fused) took 5.5 ms there against oneDNN's 4.9 (inception 15.6 / 14.8 ms); writing
each Concat part straight into its channel slice (a strided destination descriptor) makes
oneDNN 2023.2 fall back to ref:any (squeezenet 700 ms a run), so Concat copies.  What the
regions still pay over per-node runs: the activation as a separate pass after each
convolution (oneDNN's eltwise post-op turns NaN into 0 where ONNX keeps it) and the Concat
copy (per node, Concat is in place).  Tried and dropped (s24): Relu as oneDNN's ELU post-op with
alpha 0 (x > 0 ? x : 0 * (exp(x) - 1) keeps NaN, where its relu, clip and clip_v2 post-ops give
0), in place of the pass: light_squeezenet with regions, CPU ms, 11.51 and 11.60 against 11.49
and 11.72 without it; light_inception_v2 63.6 and 64.6 against 53.1 and 57.7 (load 5-7).
s25: tied channels (the light models' equal filters) were copied per pixel channel by channel,
5.4% of squeezenet's samples with regions; as runs (a broadcast or a block per pixel) 1.1%.
Then, CPU ms at 1 thread, one process with both sessions, runs alternated, medians (load 1-7),
with regions / without: light_squeezenet 9.51 / 9.35, 9.67 / 9.55, 9.53 / 9.39 (1.01-1.02);
light_inception_v2 46.1 / 48.1, 57.5 / 58.2 (0.96-0.99); light_resnet50 101.9 / 107.7,
100.0 / 111.0, 110.2 / 117.1 (0.90-0.95); light_densenet121 89.1 / 87.1, 93.6 / 93.0 (1.01-1.02);
light_vgg19 514 / 503, 506 / 493 (1.02-1.03).  A region planned for 2 threads also kept both
threads on a busy machine, where per-node convolutions fall back to the calling thread
(threads.c): resnet50 at 2 threads, load 5-6, 358 and 607 ms CPU a run against 124-133 without
regions.  It now carries a twin planned for one thread (its weights shared where laid out
alike) that runs in its place then: 104 and 118 against 116 and 126 (load 4.5-5).
The suite's 1-thread rows (benchmarks/test_optimized_vs_ort.py, 100 ms pauses, load 1.6-2.1),
two passes each, ours / onnxruntime with regions and without: resnet50 1.10, 1.19 / 1.21,
1.15; inception_v2 1.21, 1.20 / 1.35, 1.13; squeezenet 1.30, 1.26 / 1.26, 1.35: within the
passes' spread, so no default change.  densenet121 loses because its 61 regions are each a
1x1 then a 3x3 convolution: the region's entry transposes the 1x1's wide input (256-1024
channels) where per node only the 3x3's 128 channels in and 32 out are transposed (our 1x1
reads NCHW); a region should start only where it transposes less than its members would.
The earlier nChw8c variant (jit:avx2 / jit_1x1:avx2, not brgconv) measured on a quiet
machine, with regions / without, ms: 1 thread: resnet50 103.4 / 102.8, densenet121 92.7 / 85.1,
inception_v2 53.8 / 52.3, squeezenet 11.5 / 12.9, vgg19 514.9 / 510.5; 2 threads: resnet50
65.6 / 67.5, densenet121 58.7 / 54.5, inception_v2 28.4 / 33.6, squeezenet 8.35 / 8.38."""
from __future__ import annotations

import heapq
import os

import numpy as np
from onnx import helper

from reference.ops.conv import tied_filters

from . import kernels

ENV = "ONNX_PARITY_ONEDNN_REGIONS"
DOMAIN = "onnx_parity.plan"
CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}
# activations whose value at 0 is 0, so a blocked layout's zero padding channels stay zero
ZERO_AT_ZERO = {"Relu", "LeakyRelu", "Tanh", "HardSwish", "Gelu", "GeluTanh"}
MIN_MEMBERS = 2  # one convolution alone is OneDNNConv's case (or ours), not a region
# an RGB stem (3 channels in) runs faster as our direct stem kernel than as oneDNN's in NHWC
# (onednn_conv.toml class few-input-channels: 852 against 1232 us at 224x224), so it starts no region
MIN_INPUT_CHANNELS = 4
# unset ONNX_PARITY_ONEDNN_REGIONS turns regions on where kernels.isa() is "avx512" only if
# this is True.  In one process per session light_squeezenet measured 1.00-1.05 (median 1.02)
# at 1 thread against 0.96-0.99 for resnet50, inception_v2 and vgg19; in the suite (100 ms
# pauses, each runtime in its own process, two passes each way, quiet machine) regions took
# resnet50 from 1.16 / 1.14 and 1.11 / 1.25 of onnxruntime (1 / 2 threads) to 0.99 / 1.02 and
# 0.99 / 1.01, inception_v2 from 1.16 / 1.16 and 1.21 / 1.16 to 1.10 / 1.10 and 1.05 / 1.05,
# and the shared-process resnet50 from 1.28 and 1.17 to 1.03 and 1.01, with squeezenet,
# densenet121 and vgg19 within the passes' spread (docstring, s26)
DEFAULT_ON_AVX512 = True


def setting() -> str:
    """"off", "on" (regions that transpose less than their members would) or "all" (every
    region, whatever it transposes: for tests and measurements)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("1", "on", "true"):
        return "on"
    if value == "all":
        return value
    if value in ("0", "off", "false") or kernels.isa() != "avx512" or not DEFAULT_ON_AVX512:
        return "off"
    return "on"


def enabled() -> bool:
    return setting() != "off" and kernels.onednn_unavailable() is None


def _key(node) -> tuple[str, str]:
    return (node.domain if node.domain != "ai.onnx" else "", node.op_type)


def _constant_f32(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == np.float32


def _conv_ok(plan, step, attrs) -> bool:
    w = plan.template[step.inputs[1]] if len(step.inputs) > 1 and step.inputs[1] >= 0 else None
    if not _constant_f32(w) or w.ndim != 4 or w.size == 0 or attrs.get("group", 1) != 1:
        return False
    if w.shape[1] < MIN_INPUT_CHANNELS:
        return False
    if len(step.inputs) > 2 and step.inputs[2] >= 0:
        b = plan.template[step.inputs[2]]
        if not _constant_f32(b) or b.shape != w.shape[:1]:
            return False
    # a constant residual has no value in the region, which would run the sum without it
    if len(step.inputs) > 3 and step.inputs[3] >= 0 and plan.template[step.inputs[3]] is not None:
        return False
    activation = attrs.get("activation")
    if isinstance(activation, bytes):
        activation = activation.decode()
    return activation is None or activation in ZERO_AT_ZERO


def _pool_ok(attrs) -> bool:
    return (attrs.get("auto_pad", "NOTSET") == "NOTSET" and not attrs.get("ceil_mode", 0)
            and all(d == 1 for d in attrs.get("dilations") or ())
            and not attrs.get("storage_order", 0)
            and len(attrs.get("kernel_shape") or ()) == 2)


def member_kind(plan, step) -> str | None:
    """"conv", "joins" (an op joining its inputs' region) or None."""
    if step.run is None or len([o for o in step.outputs if o >= 0]) != 1:
        return None
    key = _key(step.node)
    attrs = plan.static_attributes(step.node) or {}
    if key in CONVS:
        return "conv" if _conv_ok(plan, step, attrs) else None
    if key in (("", "Relu"), ("", "Add"), ("", "GlobalAveragePool")):
        return "joins"
    if key == ("", "Concat") and attrs.get("axis") in (1, -3):
        return "joins"
    if key in (("", "MaxPool"), ("", "AveragePool")) and _pool_ok(attrs):
        return "joins"
    return None


def _leaves_and_returns(region, data, producer, region_of, taint) -> bool:
    """Whether an input made outside the region depends on the region (joining would make a
    cycle between the region's step and that input's)."""
    return any(region in taint.get(s, ()) for s in data
               if region_of.get(producer.get(s, -1)) != region)


def group_steps(plan, steps: list) -> list:
    """steps with each blocked region replaced by one step (kernel "fast", run by a
    RegionRun), in an order that keeps every value made before it is read.  A plan with no
    convolution never asks for oneDNN: opening the library adds about 20 MiB to the process."""
    if not any(_key(step.node) in CONVS for step in steps) or not enabled():
        return steps
    producer: dict[int, int] = {}  # slot -> index of the step making it
    region_of: dict[int, int] = {}  # step index -> region id
    taint: dict[int, frozenset] = {}  # slot -> regions it depends on
    members: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        kind = member_kind(plan, step)
        data = [s for s in step.inputs if s >= 0 and plan.template[s] is None]
        regions = {region_of.get(producer.get(s, -1)) for s in data}
        joined = None
        if kind == "joins" and len(regions) == 1 and None not in regions:
            joined = regions.pop()
        elif kind == "conv" and data:
            joined = region_of.get(producer.get(step.inputs[0], -1))
        if joined is not None and _leaves_and_returns(joined, data, producer, region_of, taint):
            joined = None
        if joined is None and kind == "conv" and data:
            joined = len(members)  # a new region
        depends = frozenset().union(*(taint.get(s, frozenset()) for s in data))
        if joined is not None:
            members.setdefault(joined, []).append(i)
            region_of[i] = joined
            depends |= {joined}
        for s in step.outputs:
            if s >= 0:
                producer[s] = i
                taint[s] = depends
    groups = [ids for ids in members.values() if len(ids) >= MIN_MEMBERS
              and any(member_kind(plan, steps[k]) == "conv" for k in ids)]
    if setting() != "all":
        readers = _readers(plan, steps)
        groups = [ids for ids in groups if _transposes_less(plan, steps, ids, readers)]
    if not groups:
        return steps
    return _replace(plan, steps, groups)


def _stride_area(attrs) -> int:
    strides = attrs.get("strides") or (1, 1)
    return int(np.prod(strides))


def _readers(plan, steps: list) -> dict[int, set[int]]:
    """slot -> the indices of the steps that read it."""
    readers: dict[int, set[int]] = {}
    for i, step in enumerate(steps):
        for s in plan.reads(step):
            readers.setdefault(s, set()).add(i)
    return readers


def _transposed(plan, steps: list, ids: list[int],
                readers: dict[int, set[int]]) -> tuple[float, float]:
    """(values the region transposes at its entries and exits, values its members transpose
    run one by one), counted as channels times pixels in units of the first member's input
    plane (strides divide it; a global pool's single pixel counts 0).  One by one, only the
    convolutions that onednn_conv.toml gives oneDNN transpose (their input and output); ours
    (1x1, depthwise, grouped, few input channels) and the other members read NCHW.  The
    region's activation passes and Concat copies are not counted: counted as passes, they
    would reject resnet50's, inception_v2's and squeezenet's regions, which measured faster."""
    from .cpu import ONEDNN_CONV_RULES, conv_class

    inside, keep = set(ids), set(plan.output_slots)
    size: dict[int, float] = {}  # slot -> channels x relative pixels
    scale: dict[int, float] = {}  # slot -> pixels relative to the first input's plane
    entries: dict[int, float] = {}
    per_node = 0.0
    for k in ids:
        step = steps[k]
        key, attrs = _key(step.node), plan.static_attributes(step.node) or {}
        data = [s for s in step.inputs if s >= 0 and plan.template[s] is None]
        out = next(s for s in step.outputs if s >= 0)
        if key in CONVS:
            w = plan.template[step.inputs[1]]
            x = step.inputs[0]
            if x not in scale:
                scale[x], size[x] = 1.0, float(w.shape[1])
                entries[x] = size[x]
            scale[out] = scale[x] / _stride_area(attrs)
            size[out] = w.shape[0] * scale[out]
            for z in data[1:]:  # a residual from outside: an entry of the output's shape
                if z not in size:
                    scale[z], size[z] = scale[out], size[out]
                    entries[z] = size[z]
            if ONEDNN_CONV_RULES.get(conv_class(w, attrs.get("group", 1))) == "onednn":
                per_node += size[x] + size[out]
        elif key == ("", "GlobalAveragePool"):
            scale[out], size[out] = 0.0, 0.0
        elif key in (("", "MaxPool"), ("", "AveragePool")):
            scale[out] = scale[data[0]] / _stride_area(attrs)
            size[out] = size[data[0]] / _stride_area(attrs)
        elif key == ("", "Concat"):
            scale[out], size[out] = scale[data[0]], sum(size[s] for s in data)
        else:  # Relu, Add
            scale[out], size[out] = scale[data[0]], size[data[0]]
    exits = sum(size[s] for k in ids for s in steps[k].outputs
                if s >= 0 and (s in keep or readers.get(s, set()) - inside))
    return sum(entries.values()) + exits, per_node


def _transposes_less(plan, steps: list, ids: list[int], readers: dict[int, set[int]]) -> bool:
    """Whether a region pays: it transposes fewer values at its entries and exits than its
    members would one by one (densenet's 1x1-then-3x3 pairs transpose the 1x1's wide input
    as a region, mobilenet's 1x1 chains transpose nothing one by one)."""
    region, per_node = _transposed(plan, steps, ids, readers)
    return region < per_node


def _replace(plan, steps: list, groups: list[list[int]]) -> list:
    from .plan import Step

    readers: dict[int, set[int]] = {}
    for i, step in enumerate(steps):
        for s in plan.reads(step):
            readers.setdefault(s, set()).add(i)
    keep = set(plan.output_slots)
    placed: dict[int, object] = {}
    taken: set[int] = set()
    for ids in groups:
        inside = set(ids)
        made = {s for k in ids for s in steps[k].outputs if s >= 0}
        entries: list[int] = []
        for k in ids:
            for s in steps[k].inputs:
                if s >= 0 and s not in made and plan.template[s] is None and s not in entries:
                    entries.append(s)
        exits = [s for k in ids for s in steps[k].outputs
                 if s >= 0 and (s in keep or readers.get(s, set()) - inside)]
        run = RegionRun(plan, [steps[k] for k in ids], entries, exits)
        node = helper.make_node("OneDNNRegion", [plan.names[s] for s in entries],
                                [plan.names[s] for s in exits], domain=DOMAIN,
                                name=" > ".join(steps[k].node.name or steps[k].node.op_type
                                                for k in ids))
        placed[ids[-1]] = Step(node, run, entries, exits, kernel="fast")
        taken |= inside
    ordered = [placed.get(i, step) for i, step in enumerate(steps)
               if i not in taken or i in placed]
    return _topological(ordered)


def _topological(steps: list) -> list:
    """steps ordered so each runs after the steps making its inputs, else as listed."""
    producer = {s: i for i, step in enumerate(steps) for s in step.outputs if s >= 0}
    waiting = [0] * len(steps)
    after: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        for s in {s for s in step.inputs if s >= 0}:
            p = producer.get(s)
            if p is not None and p != i:
                waiting[i] += 1
                after.setdefault(p, []).append(i)
    ready = [i for i in range(len(steps)) if waiting[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(steps[i])
        for j in after.get(i, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(steps):
        raise RuntimeError("blocked regions made a cycle between steps")  # a grouping bug
    return order


class RegionRun:
    """A region's step: on each input-shape signature and thread count, the OneDNNRegion
    planned for it (or None where oneDNN refused it: the members then run one by one)."""

    def __init__(self, plan, steps: list, entries: list[int], exits: list[int]):
        self.plan, self.steps, self.entries, self.exits = plan, steps, entries, exits
        self._planned: dict[tuple, object] = {}

    def planned(self, shapes: tuple):
        key = (shapes, kernels.get_num_threads())
        if key not in self._planned:
            try:
                self._planned[key] = self._build(shapes)
            except (RuntimeError, ValueError, KeyError):
                self._planned[key] = None
        return self._planned[key]

    def __call__(self, *values):
        shapes = tuple(getattr(v, "shape", None) for v in values)
        region = None
        if all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim == 4 for v in values):
            region = self.planned(shapes)
        if region is not None:
            return region(*values)
        return self._one_by_one(values)

    def _one_by_one(self, values) -> list:
        known = dict(zip(self.entries, values))
        for step in self.steps:
            ins = [known[s] if s in known else (self.plan.template[s] if s >= 0 else None)
                   for s in step.inputs]
            for s, v in zip(step.outputs, step.run(*ins)):
                if s >= 0:
                    known[s] = v
        return [known[s] for s in self.exits]

    def describe(self, in_specs: list) -> list | None:
        """The step-table entry running the region for inputs of these (shape, dtype)."""
        if any(spec is None or spec[1] != np.float32 for spec in in_specs):
            return None
        region = self.planned(tuple(tuple(spec[0]) for spec in in_specs))
        return None if region is None else [region.step(self.entries, self.exits)]

    def _build(self, shapes: tuple):
        """The region planned for the configured threads; above one, with a twin planned for
        one thread, which runs in its place when the kernels fall back to the calling thread
        on a busy machine (as per-node convolutions do: a team's barrier waits milliseconds for
        a core there)."""
        region = self._build_for(shapes, None)
        if region.threads > 1:
            region.attach_single(self._build_for(shapes, 1))
        return region

    def _build_for(self, shapes: tuple, threads: int | None):
        value_of: dict[int, int] = {}

        def value(slot: int) -> int:
            return value_of.setdefault(slot, len(value_of))

        for s in self.entries:
            value(s)
        for step in self.steps:
            for s in step.outputs:
                if s >= 0:
                    value(s)
        region = kernels.OneDNNRegion(len(value_of), threads)
        for s, shape in zip(self.entries, shapes):
            region.entry(value_of[s], shape)
        for step in self.steps:
            self._add(region, step, value_of)
        for s in self.exits:
            region.exit(value_of[s])
        region.finish()
        return region

    def _add(self, region, step, value_of) -> None:
        key, attrs = _key(step.node), self.plan.static_attributes(step.node) or {}
        ins = [value_of.get(s, -1) for s in step.inputs]
        out = value_of[next(s for s in step.outputs if s >= 0)]
        if key in CONVS:
            w = self.plan.template[step.inputs[1]]
            b = self.plan.template[step.inputs[2]] if len(step.inputs) > 2 and step.inputs[2] >= 0 else None
            residual = ins[3] if len(ins) > 3 else -1
            ties = tied_filters(w, 1) if residual < 0 else None  # as cpu's Conv picks them
            if ties is not None and b is not None and not np.array_equal(b, b[ties]):
                ties = None
            activation = attrs.get("activation")
            if isinstance(activation, bytes):
                activation = activation.decode()
            region.conv(ins[0], residual, out, w, b, strides=attrs.get("strides"),
                        pads=attrs.get("pads"), dilations=attrs.get("dilations"),
                        group=attrs.get("group", 1), auto_pad=attrs.get("auto_pad", "NOTSET"),
                        activation=activation,
                        activation_params=list(attrs.get("activation_params") or ()), ties=ties)
        elif key == ("", "Relu"):
            region.activation(ins[0], out, "Relu")
        elif key == ("", "Add"):
            region.add(ins[0], ins[1], out)
        elif key == ("", "Concat"):
            region.concat(ins, out)
        elif key == ("", "GlobalAveragePool"):
            _, _, h, w = region.shapes[ins[0]]
            region.pool(ins[0], out, "average", (h, w), (1, 1), (0, 0, 0, 0))
        else:
            kernel = list(attrs["kernel_shape"])
            pads = list(attrs.get("pads") or (0, 0, 0, 0))
            kind = "max" if key == ("", "MaxPool") else (
                "average_with_pads" if attrs.get("count_include_pad", 0) else "average")
            region.pool(ins[0], out, kind, kernel, list(attrs.get("strides") or (1, 1)),
                        (pads[0], pads[1], pads[2], pads[3]))
