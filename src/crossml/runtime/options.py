"""SessionOptions, RunOptions and the enums, with onnxruntime's names and defaults."""

from __future__ import annotations

import enum
from typing import Any


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class SessionOptions:
    """onnxruntime.SessionOptions: settings read once, when a session is created."""

    def __init__(self) -> None:
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_cpu_mem_arena = True
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.use_deterministic_compute = False
        self._config: dict[str, str] = {}
        self._dim_by_name: dict[str, int] = {}
        self._dim_by_denotation: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        self._external_initializers: dict[str, Any] = {}
        self._memory_files: dict[str, Any] = {}

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self._dim_by_name[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        self._dim_by_denotation[str(dim_denotation)] = int(dim_value)

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        from crossml.runtime.errors import InvalidArgument

        if key not in self._config:
            raise InvalidArgument(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]

    def has_session_config_entry(self, key: str) -> bool:
        return key in self._config

    def add_initializer(self, name: str, ort_value: Any) -> None:
        self._initializers[str(name)] = ort_value

    def add_external_initializers(self, names: list[str], ort_values: list[Any]) -> None:
        """Initializer values given in place of the model's (same type and shape; their external-data file need not
        exist), as onnxruntime takes them."""
        import numpy as np

        from crossml.runtime.errors import InvalidArgument
        from crossml.runtime.ortvalue import OrtValue

        if len(names) != len(ort_values):
            raise InvalidArgument(f"add_external_initializers: {len(names)} names but {len(ort_values)} values")
        for name, value in zip(names, ort_values):
            self._external_initializers[str(name)] = value.numpy() if isinstance(value, OrtValue) else np.asarray(value)

    def add_external_initializers_from_files_in_memory(self, names: list[str], buffers: list[Any],
                                                       lengths: list[int]) -> None:
        """The bytes of external-data files, by the location the model names them with (copied here)."""
        import numpy as np

        from crossml.runtime.errors import InvalidArgument

        if not len(names) == len(buffers) == len(lengths):
            raise InvalidArgument(f"add_external_initializers_from_files_in_memory: {len(names)} names, "
                                  f"{len(buffers)} buffers and {len(lengths)} lengths")
        for name, buffer, length in zip(names, buffers, lengths):
            data = np.frombuffer(buffer, dtype=np.uint8)
            if not 0 <= int(length) <= data.size:
                raise InvalidArgument(f"add_external_initializers_from_files_in_memory: file '{name}' has length "
                                      f"{length} but its buffer holds {data.size} bytes")
            self._memory_files[str(name)] = data[: int(length)].copy()

    def register_custom_ops_library(self, library_path: str) -> None:
        from crossml.runtime.errors import NotImplemented as OrtNotImplemented

        raise OrtNotImplemented(
            f"custom-op libraries ({library_path}) are native onnxruntime plug-ins; register a Python "
            "op with crossml.ops.op instead"
        )


class RunOptions:
    """onnxruntime.RunOptions: settings for one run."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.run_tag = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}
        self._adapters: list[Any] = []

    def add_active_adapter(self, adapter: Any) -> None:
        """Feed a loaded ``LoraAdapter``'s parameters on runs with these options (see crossml.runtime.adapters)."""
        from crossml.runtime.adapters import LoraAdapter
        from crossml.runtime.errors import InvalidArgument

        if not isinstance(adapter, LoraAdapter):
            raise TypeError(f"add_active_adapter: expected a crossml.LoraAdapter, got {type(adapter).__name__}")
        if not adapter.loaded:
            raise InvalidArgument("add_active_adapter: the LoraAdapter holds no parameters; call its Load(path) first")
        self._adapters.append(adapter)

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        from crossml.runtime.errors import InvalidArgument

        if key not in self._config:
            raise InvalidArgument(f"RunOptions does not have configuration with key: {key}")
        return self._config[key]
