"""InferenceSession: onnxruntime's session API over crossml's plan engine."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch

from crossml import dtypes
from crossml.device.recording import Recording, capture_supported
from crossml.graph import external
from crossml.graph.execute import execute
from crossml.graph.load import apply_free_dimension_overrides, load_model, prepare, skeleton
from crossml.graph.passes import apply_rules
from crossml.graph.passes.attention import RULE as ATTENTION
from crossml.graph.passes.conv_relu import RULE as CONV_RELU
from crossml.graph.passes.gate_casts import GATE_CASTS
from crossml.graph.passes.gate_up import GATE_UP, GATE_UP_NBITS
from crossml.graph.passes.gather_norm import GATHER_NORM
from crossml.graph.passes.gelu import RULE as GELU
from crossml.graph.passes.linear import RULE as LINEAR
from crossml.graph.passes.mask_lengths import MASK_LENGTHS
from crossml.graph.passes.matmul_norm import (
    ATTENTION_NORM,
    MATMUL_NORM,
    MATMUL_SILU_MUL,
    SILU_MUL_NBITS,
    SILU_MUL_NORM,
)
from crossml.graph.passes.norm_casts import FOLD_SKIP_NORM, NORM_CASTS
from crossml.graph.passes.norm_matmul import NORM_MATMUL, NORM_MATMUL_CPU
from crossml.graph.passes.norm_rotary import NORM_ROTARY
from crossml.graph.passes.output_rows import DOMAIN as ROWS_DOMAIN
from crossml.graph.passes.output_rows import GATHER_ROWS, select_rows
from crossml.graph.passes.query_scale import QUERY_SCALE
from crossml.graph.passes.rotary_casts import ROTARY_CASTS
from crossml.graph.passes.short_conv import SHORT_CONV
from crossml.graph.passes.sibling_matmul import SIBLING_MATMUL
from crossml.graph.passes.skip_layer_norm import SKIP_LAYER_NORM
from crossml.graph.passes.swiglu import GEGLU, SWIGLU
from crossml.graph.plan import Plan, PlanOptions, build_plan
from crossml.kernels import warm_compiler, warm_cpu
from crossml.runtime.errors import Fail, InvalidArgument
from crossml.runtime.errors import NotImplemented as OrtNotImplemented
from crossml.runtime.options import GraphOptimizationLevel, RunOptions, SessionOptions
from crossml.runtime.ortvalue import OrtValue, to_user
from crossml.runtime.profiling import Profiler
from crossml.runtime.providers import ProviderChoice, parse_providers, resolve_device

log = logging.getLogger("crossml")

#: newest ai.onnx opset crossml accepts (the installed onnx package's).
MAX_OPSET = onnx.defs.onnx_opset_version()


class NodeArg:
    """A graph input or output as onnxruntime describes it: name, type string and shape."""

    def __init__(self, name: str, type_proto: onnx.TypeProto | None) -> None:
        self.name = name
        self._tp = type_proto
        self.type = _type_string(type_proto)
        self.shape = _shape(type_proto)

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


def _type_string(tp: onnx.TypeProto | None) -> str:
    if tp is None:
        return "tensor(float)"
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return dtypes.tensor_type_string(tp.tensor_type.elem_type)
    if which == "sparse_tensor_type":
        return f"sparse_tensor({dtypes.ort_type_name(tp.sparse_tensor_type.elem_type)})"
    if which == "sequence_type":
        return f"seq({_type_string(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({_type_string(tp.optional_type.elem_type)})"
    if which == "map_type":
        return f"map({dtypes.ort_type_name(tp.map_type.key_type)},{_type_string(tp.map_type.value_type)})"
    return "unknown"


def _shape(tp: onnx.TypeProto | None) -> list[Any] | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return [] if tp is not None and tp.WhichOneof("value") == "tensor_type" else None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
            for d in tp.tensor_type.shape.dim]


@dataclass
class ModelMetadata:
    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


class InferenceSession:
    """onnxruntime.InferenceSession.

    ``path_or_bytes`` is a file path, the model's bytes, or an ``onnx.ModelProto``. ``providers``
    is a list of names or ``(name, options)`` tuples, in priority order.
    """

    def __init__(self, path_or_bytes: Any, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, provider_options: Sequence[dict] | None = None,
                 **kwargs: Any) -> None:
        t0 = time.perf_counter_ns()
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        opts = self._sess_options
        self._model_path = os.fspath(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else None
        self._providers = parse_providers(providers, provider_options)
        self._device = resolve_device(self._providers)
        warm_compiler(self._device)  # Triton's cache key, hashed while the model loads
        if opts.intra_op_num_threads and opts.intra_op_num_threads > 0:
            torch.set_num_threads(int(opts.intra_op_num_threads))
        self._profiler = Profiler(opts.profile_file_prefix) if opts.enable_profiling else None

        # _files: the external data, mapped while the session lives
        model, self._files = load_model(path_or_bytes, opts._external_initializers, opts._memory_files)
        self._check_opsets(model)
        apply_free_dimension_overrides(model, opts._dim_by_name, opts._dim_by_denotation)
        self._raw_model = model
        model = prepare(model)
        # specialised plans are shape-inferred on the graph before fusion: onnx cannot see
        # through crossml's fused ops, and fusion keeps the name of every value that survives
        self._skeleton = skeleton(model)
        if (opts.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                and opts._config.get("ep.dml.disable_graph_fusion", "0") != "1"):
            fired = apply_rules(model, fusion_rules(self._providers[0].config, self._device))
            if fired:
                log.info("graph fusions: %s", fired)
        rows_output = opts._config.get(OUTPUT_ROWS)
        #: the row selection in front of that output's last product (crossml.graph.passes.output_rows), if found
        self._tail = select_rows(model, rows_output, ROWS_INPUT) if rows_output else None
        self._tail_plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._rows_plan: Plan | None = None  # the generic plan of runs that feed ROWS_INPUT (made on first use)
        self._model = model
        g = model.graph
        init_names = {t.name for t in g.initializer}
        self._inputs = [NodeArg(vi.name, vi.type) for vi in g.input if vi.name not in init_names]
        self._overridable = [NodeArg(vi.name, vi.type) for vi in g.input if vi.name in init_names]
        self._outputs = [NodeArg(vo.name, vo.type) for vo in g.output]
        self._input_by_name = {a.name: a for a in self._inputs + self._overridable}
        self._input_names = tuple(a.name for a in self._inputs)
        self._output_index = {a.name: i for i, a in enumerate(self._outputs)}

        fold = opts.graph_optimization_level != GraphOptimizationLevel.ORT_DISABLE_ALL
        self._fold = fold
        self._constant_cache: dict[Any, Any] = {}
        self._plan: Plan = build_plan(model, self._plan_options())
        if self._device.type == "cpu":
            warm_cpu({node.op_type for node in model.graph.node})  # numba's start, here rather than in the first run
        self._gpu = self._providers[0].config
        if self._gpu is not None and self._device.type == "cuda":
            self._set_tf32()
            # onnxruntime's CUDA provider searches convolution algorithms exhaustively by default
            torch.backends.cudnn.benchmark = True
        self._capture = self._capture_enabled()
        self._bind_io = self._sess_options._config.get(CAPTURE_BIND_IO, "0").strip().lower() in ("1", "true")
        # the CUDA provider's user_compute_stream: run every launch on the caller's stream
        self._user_stream = (torch.cuda.ExternalStream(self._gpu.user_stream, device=self._device)
                             if self._gpu is not None and self._gpu.user_stream else None)
        self._runners: OrderedDict[tuple, Any] = OrderedDict()
        self._overrides = {name: self._initializer_value(name, value) for name, value in opts._initializers.items()}
        self._apply_overrides(self._plan)
        if opts.optimized_model_filepath:
            self._write_optimized(opts.optimized_model_filepath)
        self._lock = threading.Lock()
        if self._profiler is not None:
            self._profiler.event("Session", "model_loading_and_session_initialization", t0, time.perf_counter_ns())

    def _set_tf32(self) -> None:
        """onnxruntime's CUDA provider allows TF32 for fp32 matmul / convolution unless use_tf32=0."""
        torch.backends.cuda.matmul.allow_tf32 = self._gpu.use_tf32
        torch.backends.cudnn.allow_tf32 = self._gpu.use_tf32

    def _plan_options(self, rows: bool = False) -> PlanOptions:
        """``rows``: the plan is for runs that feed ROWS_INPUT; the others' plans skip the row selection's nodes."""
        gpu = self._providers[0].config
        cfg = self._sess_options._config
        extra = {"kv_inplace": cfg.get(KV_INPLACE, "0") == "1"}
        return PlanOptions(device=self._device, fold_constants=self._fold, constant_cache=self._constant_cache,
                           channels_last=gpu.prefer_nhwc if gpu is not None else True, op_extra=extra,
                           disable_metacommands=gpu is not None and gpu.disable_metacommands,
                           tf32=gpu is None or gpu.use_tf32,
                           pass_through=frozenset() if rows else frozenset({(ROWS_DOMAIN, GATHER_ROWS)}))

    def _capture_enabled(self) -> bool:
        if self._gpu is None or not capture_supported(self._device) or self._profiler is not None:
            return False
        entry = self._sess_options._config.get("ep.dml.enable_graph_capture")
        if entry is not None:
            return entry.strip().lower() in ("1", "true")
        return self._gpu.graph_capture

    # -- model checks -------------------------------------------------------------------------
    def _check_opsets(self, model: onnx.ModelProto) -> None:
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx") and o.version > MAX_OPSET:
                raise Fail(
                    f"Load model failed: opset {o.version} of domain ai.onnx is newer than the newest "
                    f"crossml supports ({MAX_OPSET}); re-export the model with opset <= {MAX_OPSET}"
                )

    def _initializer_value(self, name: str, value: Any) -> Any:
        """A SessionOptions.add_initializer value, checked and placed on the session's device."""
        if name not in {a.name for a in self._overridable}:
            raise InvalidArgument(f"add_initializer: '{name}' is not an overridable initializer of the model")
        v = value._value if isinstance(value, OrtValue) else dtypes.from_numpy(np.asarray(value))
        return v.to(self._device) if isinstance(v, torch.Tensor) else v

    def _apply_overrides(self, plan: Plan) -> None:
        """Put the add_initializer values into ``plan`` (the generic plan and every specialised one)."""
        for name, v in self._overrides.items():
            slot = plan.input_slots[name]
            plan.constants = [(s, x) for s, x in plan.constants if s != slot] + [(slot, v)]

    def _write_optimized(self, path: str) -> None:
        from onnx import numpy_helper

        m = onnx.ModelProto()
        m.CopyFrom(self._model)
        g = m.graph
        del g.node[:]
        g.node.extend(self._plan.kept_nodes)
        used = {i for n in self._plan.kept_nodes for i in n.input} | {o.name for o in g.output}
        kept_inits = [external.materialize(t) for t in g.initializer if t.name in used]
        dropped = {t.name for t in g.initializer} - used
        kept_inputs = [vi for vi in g.input if vi.name not in dropped]  # an overridable initializer nothing reads
        del g.initializer[:]
        g.initializer.extend(kept_inits)
        del g.input[:]
        g.input.extend(kept_inputs)
        for name, v in self._plan.folded.items():
            if name in used:
                g.initializer.append(numpy_helper.from_array(dtypes.to_numpy(v), name))
        onnx.save(m, path)

    # -- metadata -----------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        m = self._raw_model
        return ModelMetadata(producer_name=m.producer_name, graph_name=m.graph.name, domain=m.domain,
                             description=m.doc_string, graph_description=m.graph.doc_string,
                             version=m.model_version,
                             custom_metadata_map={p.key: p.value for p in m.metadata_props})

    def get_providers(self) -> list[str]:
        return [p.name for p in self._providers]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {p.name: p.applied_options() for p in self._providers}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def get_profiling_start_time_ns(self) -> int:
        return self._profiler.t0 if self._profiler else 0

    def set_providers(self, providers: Sequence[Any] | None = None, provider_options: Sequence[dict] | None = None) -> None:
        self.__init__(self._model_path or self._raw_model, self._sess_options, providers, provider_options)

    def disable_fallback(self) -> None:
        pass

    def enable_fallback(self) -> None:
        pass

    def end_profiling(self) -> str:
        if self._profiler is None:
            return ""
        return self._profiler.end()

    @property
    def device(self) -> torch.device:
        """crossml extension: the torch device the session runs on."""
        return self._device

    @property
    def providers(self) -> list[ProviderChoice]:
        return list(self._providers)

    # -- running ------------------------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None) -> list[Any]:
        """Run the model; returns numpy arrays (lists for sequences, None for empty optionals)."""
        idx = self._output_indices(output_names)
        outs = self._run(input_feed, run_options)
        return [to_user(outs[i], self._outputs[i]._tp) for i in idx]

    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ort_values: Mapping[str, OrtValue],
                            run_options: RunOptions | None = None) -> list[OrtValue]:
        idx = self._output_indices(output_names)
        outs = self._run(input_dict_ort_values, run_options)
        return [OrtValue(outs[i], _elem_type(self._outputs[i]._tp)) for i in idx]

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Callable[[list[Any], Any, str], None], user_data: Any,
                  run_options: RunOptions | None = None) -> None:
        """Run on a worker thread and call ``callback(outputs, user_data, err)`` from it: the outputs as ``run``
        returns them and ``err == ""``, or ``[]`` and the error's message. Bad names raise here, at once."""
        if not callable(callback):
            raise InvalidArgument(f"run_async: callback must be callable, got {type(callback).__name__}")
        self._check_feed(input_feed)
        self._output_indices(output_names)
        feed = dict(input_feed)

        def work() -> None:
            try:
                outs = self.run(output_names, feed, run_options)
            except Exception as exc:  # noqa: BLE001 - handed to the callback, as onnxruntime does
                callback([], user_data, str(exc))
                return
            callback(outs, user_data, "")

        threading.Thread(target=work, name="crossml-run-async", daemon=True).start()

    def run_with_iobinding(self, iobinding: Any, run_options: RunOptions | None = None) -> None:
        iobinding._run(self, run_options)

    def io_binding(self) -> Any:
        from crossml.runtime.iobinding import IOBinding

        return IOBinding(self)

    def _output_indices(self, output_names: Sequence[str] | None) -> list[int]:
        if not output_names:
            return list(range(len(self._outputs)))
        idx = []
        for n in output_names:
            if n not in self._output_index:
                raise InvalidArgument(f"Invalid output name: {n}. Outputs of the model: "
                                      f"{', '.join(self._output_index)}")
            idx.append(self._output_index[n])
        return idx

    def _run(self, feed: Mapping[str, Any], run_options: RunOptions | None, *, stable: bool = False,
             into: Sequence[torch.Tensor | None] | None = None) -> list[Any]:
        """One run. ``stable`` (IOBinding): the feed's tensors are the ones of the caller's previous run, bound
        and kept alive by the caller, so a recording may read them in place. ``into`` (per output, optional):
        buffers a recording copies the outputs into (returned in their place), instead of fresh copies."""
        if self._user_stream is not None:
            with torch.cuda.stream(self._user_stream):
                return self._run_now(feed, run_options, stable, into)
        return self._run_now(feed, run_options, stable, into)

    def _run_now(self, feed: Mapping[str, Any], run_options: RunOptions | None, stable: bool = False,
                 into: Sequence[torch.Tensor | None] | None = None) -> list[Any]:
        if run_options is not None and run_options.terminate:
            raise Fail("Exiting due to terminate flag being set to true.")
        if run_options is not None and run_options._adapters and isinstance(feed, Mapping):
            feed = self._with_adapters(feed, run_options._adapters)
        self._check_feed(feed)
        converted: dict[str, Any] = {}
        for name, value in feed.items():
            arg = self._input_by_name.get(name)
            if arg is None:
                raise InvalidArgument(f"Invalid input name: {name}. Inputs of the model: "
                                      f"{', '.join(a.name for a in self._inputs)}")
            converted[name] = self._convert_input(arg, value)
        if self._gpu is not None and torch.backends.cuda.matmul.allow_tf32 != self._gpu.use_tf32 \
                and self._device.type == "cuda":
            # torch's TF32 switches are process-wide: a session created later with the other use_tf32 setting
            # changed them, and this session's products (and any recording it makes) follow its own setting
            self._set_tf32()
        if self._capture and not _eager_requested(run_options):
            # in place only where every input is the caller's own device tensor (not a copy made here)
            stable = stable and all(isinstance(v, OrtValue) and converted[n] is v._value for n, v in feed.items())
            outs = self._run_specialized(converted, stable, into, defer=_defer_requested(run_options))
            if outs is not None:
                return outs
        plan = self._plan
        if ROWS_INPUT in converted and self._tail is not None:
            if self._rows_plan is None:
                rows_plan = build_plan(self._model, self._plan_options(rows=True))
                self._apply_overrides(rows_plan)
                self._rows_plan = rows_plan
            plan = self._rows_plan
        vals = plan.initial_values()
        for name, value in converted.items():
            vals[plan.input_slots[name]] = value
        t0 = time.perf_counter_ns() if self._profiler else 0
        outs = execute(plan, vals, self._profiler)
        if self._profiler is not None:
            self._profiler.event("Session", "model_run", t0, time.perf_counter_ns())
        return outs

    def _check_feed(self, feed: Any) -> None:
        """A run's feed is a dict holding every graph input (overridable initializers may be left out)."""
        if not isinstance(feed, Mapping):
            raise InvalidArgument(f"input_feed must be a dict of input name -> value, got {type(feed).__name__}")
        missing = [a.name for a in self._inputs if a.name not in feed]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(feed)}).")

    def _with_adapters(self, feed: Mapping[str, Any], adapters: list[Any]) -> dict[str, Any]:
        """The feed with the active LoRA adapters' parameters (on this session's device): the first adapter naming
        a parameter wins, and adapters win over the feed, as in onnxruntime."""
        from crossml.runtime.adapters import active_feed

        params = active_feed(adapters, self._device)
        for name in params:
            if name not in self._input_by_name:
                owner = next(a for a in adapters if name in a._params)
                raise InvalidArgument(
                    f"Invalid input name: {name} (a parameter of the active LoRA adapter '{owner._path}'). Inputs "
                    f"of the model: {', '.join(self._input_by_name)}; the adapter was made for another model")
        return {**feed, **params}

    # -- per-signature plans and command lists (GPU) ------------------------------------------
    def _fed_names(self, feed: Mapping[str, Any]) -> tuple[str, ...]:
        """The inputs a specialised plan takes: every graph input, then the overridable initializers fed."""
        if len(feed) == len(self._input_names):
            return self._input_names
        return self._input_names + tuple(a.name for a in self._overridable if a.name in feed)

    def _run_tail(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """crossml internal (GenAI's prompts): the ``crossml.output_rows`` output computed from the values its product
        takes at every position (the graph outputs the selection added, as a run gave them), eagerly, on a plan of the
        tail alone that shares this session's device weights (its constant cache)."""
        tail = self._tail
        if tail is None:
            raise InvalidArgument(f"this session has no row selection (session config entry {OUTPUT_ROWS})")
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        plan = self._tail_plans.get(key)
        if plan is None:
            sub = tail.model(self._model)
            types = {vi.name: vi.type for vi in list(sub.graph.input) + list(sub.graph.output)}
            for vi, t in zip(sub.graph.input, inputs):
                types[vi.name] = onnx.helper.make_tensor_type_proto(dtypes.onnx_type_of(t), list(t.shape))
            plan = build_plan(sub, self._plan_options(rows=True), types)
            with self._lock:
                self._tail_plans[key] = plan
                while len(self._tail_plans) > MAX_SIGNATURES:
                    self._tail_plans.popitem(last=False)
        vals = plan.initial_values()
        for name, t in zip(tail.inputs, inputs):
            vals[plan.input_slots[name]] = t.to(self._device)
        return execute(plan, vals)[0]

    def _run_specialized(self, feed: dict[str, Any], stable: bool = False,
                         into: Sequence[torch.Tensor | None] | None = None, defer: bool = False) -> list[Any] | None:
        """Run the plan specialised for these input shapes, replaying its captured command list. ``stable``
        inputs (an IOBinding's, unchanged since its last run) get a recording of their own that reads them in
        place — no input copies — keyed by their addresses, while outputs are still copied out. Overridable
        initializers fed to the run (LoRA adapter parameters) are inputs of the recording too. ``defer`` (the run
        config entry ``crossml.graph_capture_defer``): a new signature's plan runs eagerly and is recorded on its
        next run, without the recording's own warm-up run (``_Warmed``)."""
        names = self._fed_names(feed)
        tensors = [feed[n] for n in names]
        if not all(isinstance(t, torch.Tensor) and t.device == self._device for t in tensors):
            return None
        in_place = stable and not self._bind_io
        key = self._signature(names, tensors, addresses=in_place) + (("in place",) if in_place else ())
        runner = self._runners.get(key)
        if runner is None or (isinstance(runner, _Warmed) and not defer):
            with self._lock:
                runner = self._runners.get(key)
                if runner is None:
                    runner = self._make_runner(key, tensors, in_place, defer=defer and not in_place)
                elif isinstance(runner, _Warmed) and not defer:
                    runner = self._recorded(runner.fn, tensors, runner.shapes, warm=False)
                self._runners[key] = runner
                while len(self._runners) > MAX_SIGNATURES:
                    self._runners.popitem(last=False)
        if isinstance(runner, Recording):
            return runner.run(tensors, into)
        return runner(tensors)

    def _signature(self, names: tuple[str, ...], tensors: Sequence[torch.Tensor], addresses: bool = False) -> tuple:
        """The key of the inputs' plan and recording: the names fed, shapes and dtypes, and with bound I/O (a
        recording reads its inputs in place) their addresses and strides too."""
        key = (names,) + tuple((tuple(t.shape), t.dtype) for t in tensors)
        if self._bind_io or addresses:
            key += tuple((t.data_ptr(), t.stride()) for t in tensors)
        return key

    def _bound_replay(self, feed: Mapping[str, torch.Tensor], output_names: Sequence[str],
                      detach: bool = False) -> Callable[[], list[Any]] | None:
        """crossml internal (GenAI's decode loop): with ``crossml.graph_capture_bind_io``, a function of no
        arguments replaying the graph recorded for exactly these tensors (same shapes and addresses) and
        returning the named outputs, skipping the per-run input checks; None until a run has recorded it.
        The caller must keep feeding those same tensors (writing new values into them). ``detach``: the session
        forgets the recording, which then lives as long as the returned function."""
        if not self._bind_io:
            return None
        names = self._fed_names(feed)
        key = self._signature(names, [feed[n] for n in names])
        runner = self._runners.get(key)
        if not isinstance(runner, Recording):
            return None
        if detach:
            with self._lock:
                self._runners.pop(key, None)
        idx = self._output_indices(output_names)

        def replay() -> list[Any]:
            outs = runner.replay()
            return [outs[i] for i in idx]

        return replay

    def _make_runner(self, key: tuple, example: list[torch.Tensor], in_place: bool = False,
                     defer: bool = False) -> Any:
        names = key[0]
        shapes = {n: shape for n, (shape, _) in zip(names, key[1:])}
        if in_place:
            # the first run of these bindings recorded the shapes' plan (the IOBinding's first run is not in
            # place): record the same plan again, reading the bound tensors where they are
            base = self._runners.get(self._signature(names, example))
            if base is not None and not isinstance(base, Recording):
                return base  # not recordable: runs eagerly, nothing to gain
            if base is not None:
                try:
                    return Recording(base.fn, example, self._device, bind_inputs=True, bind_outputs=False)
                except Exception as exc:  # noqa: BLE001 - keep the copying recording
                    log.info("input shapes %s: no in-place recording: %s", shapes, exc)
                    return base
        plan = build_plan(self._model, self._plan_options(rows=ROWS_INPUT in names), self._specialized_types(shapes))
        self._apply_overrides(plan)
        slots = [plan.input_slots[n] for n in names]

        def run_plan(inputs: list[Any]) -> list[Any]:
            vals = plan.initial_values()
            for slot, v in zip(slots, inputs):
                vals[slot] = v
            return execute(plan, vals)

        if not any(st.device.type != "cpu" for st in plan.steps):
            return run_plan  # nothing runs on the device: nothing to record
        if plan.capture_blockers:
            log.info("input shapes %s run without graph capture: %s", shapes, "; ".join(plan.capture_blockers[:5]))
            return run_plan
        if defer:
            return _Warmed(run_plan, shapes)
        return self._recorded(run_plan, example, shapes, in_place=in_place)

    def _recorded(self, fn: Callable[[list[Any]], list[Any]], example: list[torch.Tensor],
                  shapes: dict[str, tuple[int, ...]], *, in_place: bool = False, warm: bool = True) -> Any:
        """``fn`` (a specialised plan's run) recorded on ``example``; ``fn`` itself where capture fails. ``warm``
        False: ``fn`` already ran eagerly on these shapes (a deferred signature's second run), so the recording
        skips its warm-up run."""
        try:
            return Recording(fn, example, self._device, bind_inputs=self._bind_io or in_place,
                             bind_outputs=self._bind_io, warm=warm)
        except Exception as exc:  # noqa: BLE001 - capture is an optimisation: fall back to the eager plan
            log.info("input shapes %s run without graph capture: %s", shapes, exc)
            return fn

    def _specialized_types(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, onnx.TypeProto]:
        """Value types inferred with the inputs' concrete shapes (so shape computations fold)."""
        m = onnx.ModelProto()
        m.CopyFrom(self._skeleton)
        fed = [i for i, t in enumerate(m.graph.initializer) if t.name in shapes]
        for i in reversed(fed):  # an overridable initializer fed to the run: its shape is the value's
            del m.graph.initializer[i]
        for vi in m.graph.input:
            if vi.name in shapes:
                dims = vi.type.tensor_type.shape.dim
                for d, n in zip(dims, shapes[vi.name]):
                    d.Clear()
                    d.dim_value = int(n)
        try:
            m = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - fall back to what the model declares
            pass
        g = m.graph
        return {vi.name: vi.type for vi in list(g.value_info) + list(g.input) + list(g.output)}

    def _convert_input(self, arg: NodeArg, value: Any) -> Any:
        tp = arg._tp
        kind = tp.WhichOneof("value") if tp is not None else "tensor_type"
        if isinstance(value, OrtValue):
            inner = value._value
            if isinstance(inner, torch.Tensor) and kind == "tensor_type":
                self._check_tensor(arg, value.element_type(), tuple(inner.shape))
                return inner if inner.device == self._device else inner.to(self._device)
            return inner
        if kind == "tensor_type":
            if isinstance(value, torch.Tensor):
                self._check_tensor(arg, dtypes.onnx_type_of(value), tuple(value.shape))
                return value.to(self._device)
            arr = value if isinstance(value, np.ndarray) else _as_array(arg, value)
            self._check_tensor(arg, dtypes.onnx_type_of_numpy(arr.dtype), arr.shape)
            v = dtypes.from_numpy(arr)
            return v.to(self._device) if isinstance(v, torch.Tensor) and self._device.type != "cpu" else v
        return _convert_nontensor(value, tp, self._device)

    def _check_tensor(self, arg: NodeArg, elem_type: int, shape: tuple[int, ...]) -> None:
        tp = arg._tp
        if tp is None or not tp.HasField("tensor_type"):
            return
        expected = tp.tensor_type.elem_type
        if expected and elem_type != expected:
            raise InvalidArgument(
                f"Unexpected input data type. Actual: ({dtypes.tensor_type_string(elem_type)}) , expected: "
                f"({dtypes.tensor_type_string(expected)}) for input '{arg.name}'"
            )
        if not tp.tensor_type.HasField("shape"):
            return
        dims = tp.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise InvalidArgument(
                f"Invalid rank for input: {arg.name} Got: {len(shape)} Expected: {len(dims)} "
                f"Please fix either the inputs/outputs or the model."
            )
        bad = [(i, s, d.dim_value) for i, (s, d) in enumerate(zip(shape, dims))
               if d.HasField("dim_value") and d.dim_value != s]
        if bad:
            detail = "\n".join(f" index: {i} Got: {s} Expected: {e}" for i, s, e in bad)
            raise InvalidArgument(
                f"Got invalid dimensions for input: {arg.name} for the following indices\n{detail}\n"
                f" Please fix either the inputs/outputs or the model."
            )


MAX_SIGNATURES = 32


def fusion_rules(gpu: Any, device: torch.device) -> list[Any]:
    """The rewrites for a provider (all off with the session entry ep.dml.disable_graph_fusion=1).

    With disable_metacommands only fusions that call no vendor library remain. Off the CPU the gate
    and up products of SwiGLU MLPs are merged into one (GATE_UP), the other products of one activation by constant
    weights too (SIBLING_MATMUL: Qwen3.5's four input projections of a Gated DeltaNet layer), then RMSNorms feeding
    a 4-bit product are fused into it (NORM_MATMUL), an embedding lookup feeding an RMSNorm becomes one node
    (GATHER_NORM), the attention mask's lengths become one node (MASK_LENGTHS),
    residual Adds feeding a LayerNormalization become SkipLayerNormalization (SKIP_LAYER_NORM), a constant factor on
    LinearAttention's query folds into its scale (QUERY_SCALE: Qwen3.5's query scaling Mul), the float32 Casts around
    a half-precision MRotaryEmbedding go (ROTARY_CASTS: the same values), and those of a GatedDeltaNet's decay and beta
    (GATE_CASTS: the same values), and those around an RMSNorm the other rules leave (NORM_CASTS: the same values;
    after them all),
    and products feeding the residual stream's RMSNorm are fused into it (MATMUL_NORM; then MATMUL_SILU_MUL
    folds the MLP's gate into its merged gate/up product, or where that does not apply SILU_MUL_NORM into the down
    projection, SILU_MUL_NBITS the gate into a 4-bit down projection's node, and ATTENTION_NORM the attention into
    its output projection's fused node; not with disable_metacommands). The CPU keeps the model's ops (its
    results stay bit-close to onnxruntime's) but for fusions whose values are the unfused ops': 4-bit gate and up
    products merged (GATE_UP_NBITS: columns are computed alone), skip norms fused into the 4-bit product they feed
    (NORM_MATMUL_CPU) and the gate into the 4-bit down projection (SILU_MUL_NBITS). Every provider makes LFM2's
    six-node short-convolution block one node (SHORT_CONV: on the CPU its values bit for bit, on a GPU one launch
    for about ten); on the int8 kernel the fused nodes run the ops' kernels in one node (a decode step's
    nodes cost 20-50 us each in Python). GEGLU makes Gelu(approximate="tanh") and Mul (Gemma's MLPs) a SiluMul of
    activation gelu_tanh, which the gate/up merge and SILU_MUL_NBITS then take as SwiGLU's (on the CPU: the nodes'
    values). Last off the CPU, FOLD_SKIP_NORM folds into the residual stream's SkipSimplifiedLayerNormalization the
    scalar Muls on its inputs, the RMSNorm writing its skip and the Cast of its result (Gemma's layer scalars and
    sandwich norms; the nodes' values), and NORM_ROTARY the per-head RMSNorm before a RotaryEmbedding into its kernel
    (Gemma's query and key norms)."""
    merge = ([GATE_UP, SIBLING_MATMUL, NORM_MATMUL, GATHER_NORM, MASK_LENGTHS, SKIP_LAYER_NORM, QUERY_SCALE,
              ROTARY_CASTS, GATE_CASTS]
             if device.type != "cpu" else [GATE_UP_NBITS, NORM_MATMUL_CPU])
    if gpu is not None and gpu.disable_metacommands:
        return [GELU, SWIGLU, GEGLU, *merge,
                *([NORM_CASTS, FOLD_SKIP_NORM, NORM_ROTARY] if device.type != "cpu" else [])]
    rules = [GELU, ATTENTION, LINEAR, SWIGLU, GEGLU, *merge]
    if device.type != "cpu":
        rules += [MATMUL_NORM, MATMUL_SILU_MUL, SILU_MUL_NORM, SILU_MUL_NBITS, ATTENTION_NORM, NORM_CASTS,
                  FOLD_SKIP_NORM, NORM_ROTARY]
    else:
        rules.append(SILU_MUL_NBITS)
    rules.append(SHORT_CONV)
    if device.type == "cuda":
        rules.append(CONV_RELU)
    return rules
#: session config entry: "1" makes captured graphs read their inputs at the addresses of the tensors
#: given (one recording per set of input addresses, no input copies) and hand back their own output
#: buffers, valid until the next run with the same inputs: onnxruntime's CUDA-graph contract of I/O
#: bound at fixed addresses. The GenAI decode loop feeds fixed buffers this way.
CAPTURE_BIND_IO = "crossml.graph_capture_bind_io"
#: session config entry: "1" lets attention ops write new keys/values into the past buffers they are
#: given (the GenAI static KV cache, past_present_share_buffer), instead of returning updated copies.
KV_INPLACE = "crossml.kv_cache_in_place"
#: session config entry (crossml internal, GenAI's decoders): an output (the logits) whose runs may ask for one position
#: per batch row by feeding ROWS_INPUT ([batch] int64; runs that do not feed it compute every position as before):
#: ``crossml.graph.passes.output_rows``. The output's product's per-position inputs become graph outputs too, from
#: which ``InferenceSession._run_tail`` computes every position later
OUTPUT_ROWS = "crossml.output_rows"
ROWS_INPUT = "crossml.rows"


def _eager_requested(run_options: RunOptions | None) -> bool:
    """onnxruntime's run config ``gpu_graph_id=-1``: run this call without graph capture."""
    return run_options is not None and run_options._config.get("gpu_graph_id") == "-1"


#: crossml run config entry: "1" runs a new input signature's specialised plan eagerly and records it on the
#: signature's next run, which then needs no warm-up run of its own (what GenAI's bound buffers ask for)
DEFER_CAPTURE = "crossml.graph_capture_defer"


def _defer_requested(run_options: RunOptions | None) -> bool:
    return run_options is not None and run_options._config.get(DEFER_CAPTURE) == "1"


class _Warmed:
    """A signature's specialised plan that ran eagerly once, so its lazy state (kernels compiled and selected,
    caches filled) is set: its next run that does not defer records it without the recording's warm-up run."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]], shapes: dict[str, tuple[int, ...]]) -> None:
        self.fn, self.shapes = fn, shapes

    def __call__(self, inputs: list[Any]) -> list[Any]:
        return self.fn(inputs)




def _elem_type(tp: onnx.TypeProto | None) -> int | None:
    if tp is not None and tp.HasField("tensor_type"):
        return tp.tensor_type.elem_type
    return None


def _as_array(arg: NodeArg, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001
        raise InvalidArgument(f"input '{arg.name}' must be a numpy array, got {type(value).__name__}: {exc}") from None
    if arr.dtype == object and not (arg.type == "tensor(string)"):
        raise InvalidArgument(f"input '{arg.name}' must be a numpy array of {arg.type}, got {type(value).__name__}")
    return arr


def _convert_nontensor(value: Any, tp: onnx.TypeProto, device: torch.device) -> Any:
    which = tp.WhichOneof("value")
    if which == "optional_type":
        if value is None:
            return None
        return _convert_nontensor(value, tp.optional_type.elem_type, device)
    if which == "sequence_type":
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument(f"a sequence input expects a list, got {type(value).__name__}")
        return [_convert_nontensor(v, tp.sequence_type.elem_type, device) for v in value]
    if which == "map_type":
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"a map input expects a dict, got {type(value).__name__}")
        return dict(value)
    if which == "tensor_type":
        if isinstance(value, OrtValue):
            value = value._value
        v = value if isinstance(value, torch.Tensor) else dtypes.from_numpy(np.asarray(value))
        return v.to(device) if isinstance(v, torch.Tensor) else v
    raise OrtNotImplemented(f"inputs of type {_type_string(tp)} are not supported")
