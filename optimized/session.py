"""InferenceSession with onnxruntime's Python surface (`import optimized as ort`).

load -> validate -> graph rewrites by level (optimized/passes) -> static plan with a kernel per
node (optimized/cpu.py, else the reference op) -> run.
"""
from __future__ import annotations

import json
import time

import numpy as np
import onnx

from reference import ReferenceEvaluator
from reference.evaluator import Result, validate
from reference.types import check_feed, describe_type
from reference.values import EMPTY
from reference.weights import attached, checkable

from . import feeds as feed_conversion
from .check import NodeCheckError, check_step, write_repro  # noqa: F401 (check mode)
from .errors import Fail, InvalidArgument, as_load_errors, as_run_errors
from .loading import load_for_session, with_inferred_outputs
from .lora import adapter_feeds
from .options import (  # noqa: F401
    RECORD_ASSIGNMENT,
    ExecutionMode,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
)
from .ortvalue import OrtMemoryInfo, OrtValue
from .plan import Profiler

PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]
# onnxruntime's other InferenceSession keywords: accepted and ignored (the passes are ours)
ACCEPTED_KEYWORDS = {"disabled_optimizers", "read_config_from_model"}


class NodeArg:
    def __init__(self, value_info):
        self.name = value_info.name
        tp = value_info.type
        self.type = describe_type(tp)
        while tp.WhichOneof("value") == "optional_type":  # onnxruntime gives the inner shape
            tp = tp.optional_type.elem_type
        if tp.WhichOneof("value") == "tensor_type":
            self.shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tp.tensor_type.shape.dim
            ]
        else:
            self.shape = []

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    def __init__(self, model):
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = model.model_version
        self.custom_metadata_map = {p.key: p.value for p in model.metadata_props}


TERMINATED = "Exiting due to terminate flag being set to true."


class TerminateWatch:
    """Called by the plan after every node (its profiler hook): ends the run with Fail once
    RunOptions.terminate is set, e.g. by another thread, and passes the node on to the real
    profiler. Not used on the CUDA provider, where a hook would keep CUDA graphs from replaying
    (there terminate is read when the run starts)."""

    def __init__(self, run_options, profiler):
        self.run_options, self.profiler = run_options, profiler

    def record(self, step, values, start: float, end: float) -> None:
        if self.profiler is not None:
            self.profiler.record(step, values, start, end)
        if self.run_options.terminate:
            raise Fail(TERMINATED)


class InferenceSession:
    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None,
                 providers=None, provider_options=None, **kwargs):
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise TypeError(f"sess_options: expected optimized.SessionOptions, got "
                            f"{type(sess_options).__name__}")
        unknown = set(kwargs) - ACCEPTED_KEYWORDS
        if unknown:
            raise TypeError(f"InferenceSession got unexpected keyword arguments {sorted(unknown)}; "
                            f"accepted: {sorted(ACCEPTED_KEYWORDS)}")
        self._options = sess_options or SessionOptions()
        self._fallback = True
        self._profiling_start_ns = 0
        with as_load_errors():
            original, self._weights = load_for_session(path_or_bytes, self._options)
            validate(checkable(original))
        self._metadata = ModelMetadata(original)
        from .providers import CUDA, select

        self._providers, self._provider_options = select(providers, provider_options)
        self._model = self._rewrite(original, for_cpu=CUDA not in self._providers)
        del original  # its weights are the store's; the rewritten model is what runs
        self._evaluator = ReferenceEvaluator(self._model, check=False)
        self._inputs = [NodeArg(v) for v in self._evaluator.input_infos]
        self._outputs = [NodeArg(v) for v in with_inferred_outputs(self._model).graph.output]
        self._output_names = [o.name for o in self._outputs]
        self._output_position = {name: i for i, name in reversed(list(enumerate(self._output_names)))}
        self._checked_feeds = feed_conversion.CheckedFeeds(self._evaluator.input_infos)
        self._create_plan()

    def _create_plan(self) -> None:
        from .cpu import set_num_threads
        from .kernels import available_cpus
        from .providers import make_plan

        self._set_num_threads = set_num_threads
        # 0 (every CPU this process may use) is resolved once, as onnxruntime sizes its pool
        # when the session is made; asking the affinity mask costs a system call per run
        self._threads = self._options.intra_op_num_threads or available_cpus()
        set_num_threads(self._threads)
        fuse = self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        self._close_plan()
        self._plan = make_plan(self._model, self._evaluator, self._provider_options, fuse)
        if self._options.enable_profiling:
            self._profiler = Profiler()
            self._profiling_start_ns = time.time_ns()
        else:
            self._profiler = None

    def _close_plan(self) -> None:
        plan = self.__dict__.get("_plan")  # absent before the first plan, or when __init__ raised
        if plan is not None:
            plan.close()

    def __del__(self) -> None:
        self._close_plan()

    def _rewrite(self, model, *, for_cpu: bool):
        from .passes import optimize

        level = int(self._options.graph_optimization_level)
        rewritten = optimize(model, level, self._weights, for_cpu=for_cpu) if level > 0 else model
        if self._options.optimized_model_filepath:
            onnx.save(attached(rewritten), self._options.optimized_model_filepath)
        return rewritten

    # onnxruntime's surface ------------------------------------------------------------
    def run(self, output_names, input_feed, run_options=None):
        """Outputs as NumPy arrays, lists (sequences), dicts (maps) or None (empty optional),
        in the order of `output_names` (every output when it is None or empty)."""
        wanted = self._output_indices(output_names) if output_names else None
        if run_options is None and self._checked_feeds.passed(input_feed):
            feeds = dict(input_feed)
        else:
            feeds = self._prepare_feeds(input_feed, run_options)
        options = self._options
        self._set_num_threads(self._threads)  # sessions may differ
        checker = self._check_node if options.check_nodes else None
        profiler = self._profiler
        if run_options is not None and "CUDAExecutionProvider" not in self._providers:
            profiler = TerminateWatch(run_options, profiler)
        try:
            outputs = self._plan.run(feeds, profiler=profiler, checker=checker)
        except Exception:
            with as_run_errors():  # here, not around the call: entering it costs on every run
                raise
        outputs = feed_conversion.unshared_outputs(outputs, feeds)
        return outputs if wanted is None else [outputs[i] for i in wanted]

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        """run() with OrtValues in and out."""
        for name, value in input_dict_ort_values.items():
            if not isinstance(value, OrtValue):
                raise TypeError(f"input {name!r}: run_with_ort_values takes OrtValues, got "
                                f"{type(value).__name__}")
        return [OrtValue(v) for v in self.run(output_names, input_dict_ort_values, run_options)]

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None) -> None:
        """Run on a worker thread and call callback(results, user_data, error_message); the
        message is '' on success, and results is [] on failure (onnxruntime's convention)."""
        import threading

        wanted = self._output_indices(output_names)
        self._check_names(input_feed)

        def work():
            try:
                outputs = self.run(None, input_feed, run_options)
            except Exception as e:  # noqa: BLE001 (reported to the callback, as onnxruntime does)
                callback([], user_data, str(e))
                return
            callback([outputs[i] for i in wanted], user_data, "")

        threading.Thread(target=work, name="optimized-run-async", daemon=True).start()

    @property
    def optimized_model(self):
        """The model after the graph rewrites of this session's level, with its weights (a new
        copy on each call: the session itself keeps them once, outside the model)."""
        return attached(self._model)

    def iter_results(self, input_feed):
        """Initializers, inputs, every node result (subgraph values with their path) and the
        outputs, as the reference evaluator yields them: the observer hook for diffing."""
        input_feed = self._prepare_feeds(input_feed, None)
        for name, value in self._evaluator.initial_values().items():
            if name not in input_feed:
                yield Result("initializer", name, value)
        for name, value in input_feed.items():
            yield Result("input", name, value)
        produced: list[Result] = []
        with as_run_errors():
            outputs = self._plan.run(input_feed, observer=produced.append)
        yield from produced
        for out, value in zip(self._outputs, outputs):
            yield Result("output", out.name, value)

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_overridable_initializers(self):
        return [NodeArg(v) for v in self._evaluator.overridable]

    def get_providers(self):
        return list(self._providers)

    def get_provider_options(self):
        from .providers import as_strings

        return as_strings(self._provider_options)

    def set_providers(self, providers=None, provider_options=None) -> None:
        """Re-plan the session for other providers (the CPU provider when None). The model
        keeps the rewrite made for the first providers: CPU-only rewrites (weight packing)
        then run on the host under the CUDA provider."""
        from .providers import select

        self._providers, self._provider_options = select(providers, provider_options)
        self._create_plan()

    def disable_fallback(self) -> None:
        """Accepted: a node without a fast kernel always runs the reference op."""
        self._fallback = False

    def enable_fallback(self) -> None:
        self._fallback = True

    def get_input_memory_infos(self):
        return [self._memory_info() for _ in self._inputs]

    def get_output_memory_infos(self):
        return [self._memory_info() for _ in self._outputs]

    def _memory_info(self) -> OrtMemoryInfo:
        """Where the plan reads inputs and writes outputs: the GPU on the CUDA provider (run()
        copies host feeds there), else the host."""
        cuda = self._provider_options.get("CUDAExecutionProvider")
        if cuda is not None:
            return OrtMemoryInfo.for_provider("CUDAExecutionProvider", cuda["device_id"])
        return OrtMemoryInfo.for_provider("CPUExecutionProvider")

    def get_provider_graph_assignment_info(self):
        """Which provider runs which node, once the config entry
        'session.record_ep_graph_assignment_info' is '1' (as onnxruntime requires)."""
        from .assignment import assignment_info

        if self._options.config.get(RECORD_ASSIGNMENT) != "1":
            raise Fail(f"Session configuration entry '{RECORD_ASSIGNMENT}' must be set to "
                             f"\"1\" to retrieve EP graph assignment information.")
        return assignment_info(self._plan, self._providers)

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started, in ns of the system clock (time.time_ns(), as onnxruntime
        measures it); 0 when profiling is off."""
        return self._profiling_start_ns

    def io_binding(self):
        from .iobinding import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options=None) -> None:
        """Run on the bound inputs; outputs bound to "cuda" stay on the device, outputs bound
        to a buffer or an OrtValue are written into it."""
        names = [o.name for o in self._outputs]
        wanted = iobinding.outputs(names)
        for name, _ in wanted:
            if name not in names:
                raise InvalidArgument(f"unknown output {name!r}; the model's outputs are {names}")
        on_device = [n for n, where in wanted if where == "cuda"]
        if on_device and "CUDAExecutionProvider" not in self._providers:
            raise InvalidArgument(f"outputs {on_device} are bound to cuda, but this session runs "
                                  f"on {self._providers}")
        feeds = iobinding.feeds()
        if run_options is None and self._checked_feeds.passed(feeds):
            pass  # plain arrays of the inputs' types, as run()'s fast path (a generation loop)
        elif not on_device and all(isinstance(v, (np.ndarray, OrtValue)) for v in feeds.values()):
            feeds = self._prepare_feeds(feeds, run_options)
        self._set_num_threads(self._threads)  # as run(): sessions may differ
        with as_run_errors():
            if on_device:
                outputs = self._plan.run(feeds, device_outputs=on_device)
            else:
                outputs = self._plan.run(feeds)
        outputs = feed_conversion.unshared_outputs(outputs, feeds)
        iobinding.set_results([outputs[names.index(n)] for n, _ in wanted])

    def get_session_options(self):
        return self._options

    def get_modelmeta(self):
        return self._metadata

    def end_profiling(self) -> str:
        """Write the Chrome-trace JSON of the runs so far; returns its path ('' if disabled)."""
        if self._profiler is None:
            return ""
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self._options.profile_file_prefix}_{stamp}.json"
        with open(path, "w") as f:
            json.dump(self._profiler.events, f)
        self._profiler = Profiler()
        return path

    # checks ---------------------------------------------------------------------------
    def _output_indices(self, output_names) -> list[int]:
        if not output_names:
            return list(range(len(self._output_names)))
        position = self._output_position
        for name in output_names:
            if name not in position:
                raise InvalidArgument(f"unknown output {name!r}; the model's outputs are "
                                      f"{self._output_names}")
        return [position[n] for n in output_names]

    def _check_names(self, feeds) -> None:
        if not isinstance(feeds, dict):
            raise TypeError(f"input_feed: expected a dict of input name to value, got "
                            f"{type(feeds).__name__}")
        known = {i.name for i in self._evaluator.input_infos + self._evaluator.overridable}
        for name in feeds:
            if name not in known:
                raise ValueError(
                    f"unknown input {name!r}; the model's inputs are {self._evaluator.input_names}")
        for info in self._evaluator.input_infos:
            if info.name not in feeds:
                raise ValueError(f"missing input {info.name!r}")

    def _prepare_feeds(self, feeds: dict, run_options) -> dict:
        """Names checked, values converted as onnxruntime converts them (OrtValues unwrapped,
        lists and strings to arrays of the input's type), then types and shapes checked."""
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise TypeError(f"run_options: expected optimized.RunOptions, got "
                                f"{type(run_options).__name__}")
            if run_options.terminate:
                raise Fail(TERMINATED)
            feeds = {**adapter_feeds(run_options), **feeds}
        self._check_names(feeds)
        known = {i.name: i for i in self._evaluator.input_infos + self._evaluator.overridable}
        converted = {}
        for name, value in feeds.items():
            value = feed_conversion.convert(known[name].type, value)
            if hasattr(value, "__cuda_array_interface__"):
                checked = self._device_feed_stand_in(name, value)
            elif not isinstance(value, (np.ndarray, list, dict)) and value not in (None, EMPTY):
                raise TypeError(f"input {name!r}: expected a numpy array, got {type(value).__name__}")
            else:
                checked = value
            with as_run_errors():
                check_feed(known[name], checked)
            converted[name] = value
        return converted

    def _device_feed_stand_in(self, name: str, value) -> np.ndarray:
        """A device array (CuPy) is checked by its dtype and shape, without a copy to the host."""
        if "CUDAExecutionProvider" not in self._providers:
            raise TypeError(f"input {name!r} is a device array ({type(value).__name__}), but this "
                            f"session runs on {self._providers}; pass a numpy array")
        return np.broadcast_to(np.zeros((), dtype=np.dtype(value.dtype)), tuple(value.shape))

    def _check_node(self, step, values, outputs) -> None:
        check_step(step, values, outputs, self._model, self._options.check_nodes_dir)
