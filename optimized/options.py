"""SessionOptions, RunOptions and their enums, with onnxruntime's names and defaults.

Like onnxruntime's pybind objects, the option objects have a fixed set of attributes: a
misspelled one (`so.graph_optimisation_level = 1`) raises AttributeError instead of being
silently ignored. README's API section says which options act and which are accepted and ignored.
"""
from __future__ import annotations

import enum

from .errors import NotImplementedFeature


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99

    @classmethod
    def from_level(cls, level: int) -> GraphOptimizationLevel:
        for member in sorted(cls, reverse=True):
            if level >= member:
                return member
        return cls.ORT_DISABLE_ALL


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


# Session config keys that act here; every other key is stored and returned (as onnxruntime
# does) and has no effect.
LOAD_MODEL_FORMAT = "session.load_model_format"
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"


class _Typed:
    """An attribute converted and checked on assignment, as pybind checks argument types."""

    def __init__(self, convert, default):
        self.convert, self.default = convert, default

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj, self.slot, self.default)

    def __set__(self, obj, value):
        setattr(obj, self.slot, self.convert(value))


def _int(value) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"expected an int, got {type(value).__name__} {value!r}")
    return int(value)


def _bool(value) -> bool:
    if not isinstance(value, (bool, int)):
        raise TypeError(f"expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _str(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {type(value).__name__} {value!r}")
    return value


def _level(value) -> GraphOptimizationLevel:
    return GraphOptimizationLevel.from_level(_int(value))


def _severity(value) -> int:
    value = _int(value)
    if not -1 <= value <= 4:
        raise ValueError(f"log severity {value}: expected 0 (verbose) .. 4 (fatal), or -1 (the "
                         f"default logger's)")
    return value


def _enum(kind):
    def convert(value):
        return kind(_int(value))
    return convert


class SessionOptions:
    """onnxruntime's SessionOptions, plus `check_nodes` (compare every fast kernel with the
    reference op) and `check_nodes_dir` (where the first mismatch's repro goes)."""

    __slots__ = (
        "_check_nodes",
        "_check_nodes_dir",
        "_enable_cpu_mem_arena",
        "_enable_mem_pattern",
        "_enable_mem_reuse",
        "_enable_profiling",
        "_execution_mode",
        "_execution_order",
        "_graph_optimization_level",
        "_inter_op_num_threads",
        "_intra_op_num_threads",
        "_log_severity_level",
        "_log_verbosity_level",
        "_logid",
        "_optimized_model_filepath",
        "_profile_file_prefix",
        "_use_deterministic_compute",
        "_use_per_session_threads",
        "config",
        "external_files",
        "free_dimensions_by_denotation",
        "free_dimensions_by_name",
        "initializers",
    )

    graph_optimization_level = _Typed(_level, GraphOptimizationLevel.ORT_ENABLE_ALL)
    intra_op_num_threads = _Typed(_int, 0)
    inter_op_num_threads = _Typed(_int, 0)  # accepted; nodes run one after another
    execution_mode = _Typed(_enum(ExecutionMode), ExecutionMode.ORT_SEQUENTIAL)  # accepted
    execution_order = _Typed(_enum(ExecutionOrder), ExecutionOrder.DEFAULT)  # accepted
    enable_profiling = _Typed(_bool, False)
    profile_file_prefix = _Typed(_str, "onnxruntime_profile_")
    optimized_model_filepath = _Typed(_str, "")
    log_severity_level = _Typed(_severity, -1)  # accepted; nothing is logged
    log_verbosity_level = _Typed(_int, 0)  # accepted
    logid = _Typed(_str, "")
    enable_mem_pattern = _Typed(_bool, True)  # accepted; the plan always reuses slots
    enable_mem_reuse = _Typed(_bool, True)  # accepted
    enable_cpu_mem_arena = _Typed(_bool, True)  # accepted; NumPy allocates
    use_deterministic_compute = _Typed(_bool, False)  # accepted; runs are deterministic
    use_per_session_threads = _Typed(_bool, True)  # accepted
    check_nodes = _Typed(_bool, False)
    check_nodes_dir = _Typed(_str, "")

    def __init__(self):
        self.config: dict[str, str] = {}
        self.free_dimensions_by_name: dict[str, int] = {}
        self.free_dimensions_by_denotation: dict[str, int] = {}
        self.initializers: dict = {}  # name -> OrtValue, replacing or adding an initializer
        self.external_files: dict[str, bytes] = {}  # external data file name -> its bytes

    def add_session_config_entry(self, key: str, value: str) -> None:
        key, value = _str(key), _str(value)
        if key == LOAD_MODEL_FORMAT and value.upper() not in ("", "ONNX"):
            raise NotImplementedFeature(f"{key}={value!r}: only ONNX models load here, not onnxruntime's "
                                 f"ORT format")
        self.config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        if key not in self.config:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}")
        return self.config[key]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self.free_dimensions_by_name[_str(dim_name)] = _int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        self.free_dimensions_by_denotation[_str(dim_denotation)] = _int(dim_value)

    def add_initializer(self, name: str, ort_value) -> None:
        from .ortvalue import OrtValue

        if not isinstance(ort_value, OrtValue):
            raise TypeError(f"add_initializer({name!r}): expected an OrtValue, got "
                            f"{type(ort_value).__name__}")
        self.initializers[_str(name)] = ort_value

    def add_external_initializers(self, names: list[str], ort_values: list) -> None:
        if len(names) != len(ort_values):
            raise ValueError(f"add_external_initializers: {len(names)} names but "
                             f"{len(ort_values)} values")
        for name, value in zip(names, ort_values):
            self.add_initializer(name, value)

    def add_external_initializers_from_files_in_memory(self, file_names: list[str], buffers: list,
                                                       lengths: list[int]) -> None:
        """The contents of external data files, so a model referring to them loads without them
        on disk."""
        if not len(file_names) == len(buffers) == len(lengths):
            raise ValueError("add_external_initializers_from_files_in_memory: file_names, buffers "
                             "and lengths must have the same length")
        for name, buffer, length in zip(file_names, buffers, lengths):
            data = bytes(memoryview(buffer).cast("B"))
            if len(data) < int(length):
                raise ValueError(f"external file {name!r}: the buffer holds {len(data)} bytes, "
                                 f"fewer than its length {length}")
            self.external_files[_str(name)] = data[:int(length)]

    def register_custom_ops_library(self, library_path: str) -> None:
        raise NotImplementedFeature(
            f"register_custom_ops_library({library_path!r}): custom op libraries are compiled "
            f"against onnxruntime's C API and cannot run here; implement the op with "
            f"reference.op(...) instead")


class RunOptions:
    """onnxruntime's RunOptions. `terminate` is read when a run starts; `logid` is the run tag."""

    __slots__ = (
        "_log_severity_level",
        "_log_verbosity_level",
        "_logid",
        "_only_execute_path_to_fetches",
        "_terminate",
        "active_adapters",
        "config",
    )

    log_severity_level = _Typed(_severity, -1)  # accepted; nothing is logged
    log_verbosity_level = _Typed(_int, 0)  # accepted
    logid = _Typed(_str, "")
    terminate = _Typed(_bool, False)
    only_execute_path_to_fetches = _Typed(_bool, False)  # accepted; every output is computed

    def __init__(self):
        self.config: dict[str, str] = {}
        self.active_adapters: list = []

    def add_run_config_entry(self, key: str, value: str) -> None:
        self.config[_str(key)] = _str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self.config:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}")
        return self.config[key]

    def add_active_adapter(self, adapter) -> None:
        from .lora import LoraAdapter

        if not isinstance(adapter, LoraAdapter):
            raise TypeError(f"add_active_adapter: expected a LoraAdapter, got "
                            f"{type(adapter).__name__}")
        self.active_adapters.append(adapter)
