"""The bundled pooling runner: vLLM's V1 CPU runner with packed, bucket-padded, compiled static-shape steps.

vLLM's scheduler packs many whole prompts into a step. This runner pads the step's token count up to the next
declared bucket (the single choke point is ``_determine_batch_execution_and_padding``); with static kernels the
bucket is a ``rows x width`` shape and the step's prompts are laid out in its rows (``rows.plan``: tokens,
positions and token types gathered into row order before the graph, hidden states back after it, attention per
row). It builds attention metadata for the whole bucket, pads token_type_ids with the inputs, and runs model
forward plus pooling as one torch.compile'd graph per bucket (on the host, traced only under strict_shapes or a
chosen compile backend; otherwise the same bucket-shaped function runs eagerly; on an NPU, rbln_runtime's route
for its family compiles each captured graph). Padding never reaches an output: pooling weights are zero on
padding columns and only the step's requests are read back. Traced image models run their vision tower as graphs
per image-count bucket where vLLM's runner calls it (``graph.architectures.dual_encoder``); an image-text dual
encoder's text tower runs through the same step graphs, and a model that merges image tokens into its prompt (its
``traced_vision_tower`` hook) runs its language model as any text model over the step's embeddings (vLLM's runner
merges the image tokens' into them on the host).
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from rbln_retrieval.backend.config import BundledConfig
from rbln_retrieval.backend.graph.architectures.dual_encoder import VisionGraphs, pad_width, step_inputs, text_step
from rbln_retrieval.backend.graph.compile import (
    GraphCost,
    RecordingBackend,
    allow_recompiles,
    count_flops,
    graph_breaks,
    recording_backend,
    strict_errors,
)
from rbln_retrieval.backend.graph.host_layers import fuse_epilogues, write_in_place
from rbln_retrieval.backend.graph.pooling import TaskHead, decompose, pooling_weights
from rbln_retrieval.backend.npu import artifacts, rbln_runtime
from rbln_retrieval.backend.step import rows
from rbln_retrieval.backend.vllm_compat import (
    DualEncoderText,
    aten_vision_attention,
    dual_encoder_text,
    image_token_mask,
    int32_buffers,
    int32_embedding_indices,
    route_vision_tower,
    static_graph_loading,
    unpacked_weights_kept,
    whole_head_rotary,
)

logger = logging.getLogger(__name__)


@dataclass
class StepCounters:
    steps: int = 0
    useful_tokens: int = 0
    computed_tokens: int = 0
    steps_per_bucket: Counter = field(default_factory=Counter)  # keyed "tokens", or "rowsxwidth" for static
    useful_flops: float = 0.0  # each request's FLOPs at its own length (counted where each graph compiles)
    computed_flops: float = 0.0

    def record(self, bucket: int | str, real: int, computed: int, flops: float = 0.0, useful: float = 0.0) -> None:
        self.steps += 1
        self.useful_tokens += real
        self.computed_tokens += computed
        self.steps_per_bucket[bucket] += 1
        self.computed_flops += flops
        self.useful_flops += useful


class BundledModelRunner(CPUModelRunner):
    def __init__(self, vllm_config: Any, device: torch.device):
        super().__init__(vllm_config, device)
        self.bundled = BundledConfig.from_vllm_config(vllm_config)
        # The NPU's formulation: torch ops only, real weights, nothing of vLLM's CPU dispatch in the graph.
        self.static = self.bundled.kernels == "static"
        self.counters = StepCounters()
        self._bucket: int | None = None
        self._layout: rows.Layout | None = None  # static kernels: this step's row layout
        self._force_shape: rows.Shape | None = None  # warmup: the shape to lay the next step out in
        self.graph_costs: dict[rows.Shape, GraphCost] = {}  # static kernels: counted at each shape's first step
        self._pooled: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.heads: dict[str, TaskHead] = {}  # tasks pooled inside the graph (set once the model is loaded)
        self.methods: list[str] = []
        self.takes_token_types = False
        self.compile_backend: RecordingBackend | None = None
        self._graph_breaks_at_start = 0
        self.cache_reused = False
        self._compile_lock: IO[bytes] | None = None  # held from the first look at the cache to the manifest's write
        self.in_place_blocks = 0
        self.fused_blocks = 0  # of those, blocks on oneDNN's packed GEMMs, GELU or residual add fused (AMX, bf16)
        self.dual: DualEncoderText | None = None  # traced image-text models: the text tower's step
        self.vision: VisionGraphs | None = None  # and the vision tower's graphs

    # -- model and graph -----------------------------------------------------------------------------------
    def load_model(self, load_dummy_weights: bool = False) -> None:
        if self.static:
            with static_graph_loading():
                super().load_model(load_dummy_weights)
            int32_embedding_indices(self.model)
            whole_head_rotary(self.model)
        elif self.bundled.kernels == "host" and fuse_epilogues(self.model_config.dtype):
            with unpacked_weights_kept():
                super().load_model(load_dummy_weights)
        else:
            super().load_model(load_dummy_weights)
        if not self.is_pooling_model:
            raise RuntimeError("The bundled runner serves pooling models only; start the engine with runner='pooling'.")
        if self.supports_mm_inputs and self.bundled.traced:
            # vLLM's dual-encoder forward merges text and image vectors by host-synchronising branches: traced
            # steps run the text tower alone (graph.architectures.dual_encoder), the vision tower as graphs of its
            # own. A model with a ``traced_vision_tower`` hook gives its vision graphs' entry and feeds them to
            # vLLM's own merge on the host; its language model runs in the step graphs unchanged.
            self.dual = dual_encoder_text(self.model)
            hook = getattr(self.model, "traced_vision_tower", None)
            tower = (self.dual.image_features, self.dual.image_size) if self.dual else hook() if hook else None
            if tower is None:
                raise RuntimeError(
                    f"{type(self.model).__name__} takes images, but traced targets run only the image-text dual "
                    "encoders and models with a traced_vision_tower hook (backend/graph/architectures/)."
                )
            self.model.requires_grad_(False)  # a pooling head of torch's MultiheadAttention is trainable
            int32_buffers(self.model)
            aten_vision_attention(self.model)
            self.vision = VisionGraphs(*tower, self.model_config.dtype)
            route_vision_tower(self.model, self.vision)
        self.heads = decompose(self.model.pooler, list(self.get_supported_pooling_tasks()))
        self.methods = sorted({head.method for head in self.heads.values()})
        self.takes_token_types = "token_type_ids" in _parameters(self.model.forward)
        if self.bundled.rows:  # static steps only: the host's token buckets need no attention cost
            ratio = rows.attention_ratio(self.model_config.hf_text_config, self.bundled.gated_mlp)
            self.costs = rows.Costs(ratio, self.bundled.step_cost_tokens)
        if self.bundled.kernels == "host":
            fuse = fuse_epilogues(self.model_config.dtype)
            self.in_place_blocks, self.fused_blocks = write_in_place(self.model, fuse)
        self._graph = self._forward_and_pool
        if self.bundled.traced:
            rbln = self.bundled.target == "rbln"
            if rbln:
                rbln_runtime.contiguous_weights(self.model)
            self.compile_backend, chosen = recording_backend(self.bundled, _process_groups() if rbln else None)
            # Another process compiling this key finishes first; then its artifacts are loaded here, not rebuilt.
            self._compile_lock = artifacts.compile_lock(self.bundled.cache_dir())
            # The engine's start already refused a manifest pinned to another NPU, SDK or snapshot.
            self.cache_reused = artifacts.read(self.bundled.cache_dir()) is not None
            if rbln and self.route == "torch.compile":
                self.cache_reused = rbln_runtime.load_compile_bundle(self.bundled.cache_dir()) and self.cache_reused
            allow_recompiles(len(self.bundled.buckets) + 8)
            self._graph_breaks_at_start = graph_breaks()
            compile_options = {"options": chosen.options, "dynamic": False, "fullgraph": chosen.fullgraph}
            backend = self.compile_backend
            self._graph = torch.compile(_own_code(self._forward_and_pool), backend=backend, **compile_options)
            if self.vision is not None:
                self.vision.recorder = self.compile_backend
                self.vision.compiled = torch.compile(_own_code(self.vision.forward), backend=backend, **compile_options)
        logger.info(
            "Bundled runner (%s): buckets %s, cache %s",
            self.bundled.target,
            self.bundled.labels,
            self.bundled.cache_dir(),
        )

    def _forward_and_pool(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        weights: dict[str, torch.Tensor],
        token_type_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None = None,
        image_slots: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    ) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        if self.static and input_ids is not None:
            # vLLM's BERT folds token types into input_ids and strips them again, both in place: on a copy, the
            # graph never writes into its own input.
            input_ids = input_ids.clone()
        if self.dual is not None and image_slots is not None and inputs_embeds is not None:
            hidden = text_step(self.dual, positions, inputs_embeds, *image_slots)
        else:
            hidden = self.model(
                input_ids=input_ids,
                positions=positions,
                intermediate_tensors=None,
                inputs_embeds=inputs_embeds,
                **extra,
            )
        rows = hidden.float()
        pooled = {task: head.in_graph(weights[head.method] @ rows) for task, head in self.heads.items()}
        return hidden, pooled

    def max_requests(self, bucket: int) -> int:
        return min(bucket, self.scheduler_config.max_num_seqs)

    def scheduler_kv_groups(self) -> list[Any]:
        """KV-cache groups the scheduler sees; encoder-only layers live in a runner-only group it never sees."""
        return [
            g for g in self.kv_cache_config.kv_cache_groups if not set(g.layer_names) <= self.runner_only_attn_layers
        ]

    # -- one step ------------------------------------------------------------------------------------------
    def _determine_batch_execution_and_padding(self, num_tokens: int, num_reqs: int, *args: Any, **kwargs: Any):
        if self.bundled.rows:
            lengths = kwargs["num_scheduled_tokens_np"][:num_reqs].tolist()
            self._layout = rows.plan(lengths, self.bundled.shapes, self.costs, self._force_shape)
            self._bucket = self._layout.tokens
        else:
            self._bucket = self.bundled.bucket_for(num_tokens)
        return CUDAGraphMode.NONE, BatchDescriptor(num_tokens=self._bucket), False, None, None

    def _build_attention_metadata(self, *args: Any, **kwargs: Any):
        # The attention layers write every row of the bucket: build their metadata for all of it.
        kwargs["num_tokens_padded"] = self._bucket
        built = super()._build_attention_metadata(*args, **kwargs)
        if self._layout is not None:
            # The builder sees vLLM's contiguous order; attention runs in the layout's rows.
            seq_ids = torch.from_numpy(self._layout.seq_ids)
            for metadata in built[0].values():
                metadata.seq_ids = seq_ids
        return built

    def _get_slot_mappings(self, num_tokens_padded: int, *args: Any, **kwargs: Any):
        # The attention layers read these from the forward context inside the graph: bucket-sized (padding -1),
        # so their shape is the bucket's and never the step's.
        return super()._get_slot_mappings(self._bucket, *args, **kwargs)

    def _init_model_kwargs(self, num_reqs: int | None = None) -> dict[str, Any]:
        kwargs = super()._init_model_kwargs(num_reqs)
        if self.takes_token_types and self._bucket is not None:
            # vLLM builds token_type_ids for the real tokens only; the graph takes the whole bucket (type 0 pads).
            padded = torch.zeros(self._bucket, dtype=torch.int32)
            if (real := kwargs.get("token_type_ids")) is not None:
                padded[: real.shape[0]] = real
            kwargs["token_type_ids"] = padded
        return kwargs

    def _model_forward(
        self,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **model_kwargs: Any,
    ) -> torch.Tensor:
        # Multimodal models take every step as embeddings: vLLM's runner has put the vision tower's
        # vectors and the text tokens' embeddings into inputs_embeds before the graph.
        embeds_refused = inputs_embeds is not None and not self.supports_mm_inputs
        if intermediate_tensors is not None or embeds_refused or (input_ids is None and inputs_embeds is None):
            raise NotImplementedError("The bundled runner takes token ids only (no prompt embeddings, no pipeline).")
        unknown = set(model_kwargs) - {"token_type_ids"}
        if unknown:
            raise NotImplementedError(f"The bundled runner does not pass model inputs {sorted(unknown)}.")
        steps_inputs = [t for t in (input_ids, inputs_embeds) if t is not None]
        bucket = steps_inputs[0].shape[0]
        num_reqs = self.input_batch.num_reqs
        query_start = self.query_start_loc.cpu[: num_reqs + 1].numpy()
        real = int(query_start[-1])
        # Stale inputs from earlier steps would make padding depend on history (a text tower that pools the
        # last token reads the positions to find where each prompt ends).
        for tensor in [*steps_inputs, *([positions] if positions is not None else [])]:
            tensor[real:].zero_()
        token_types = model_kwargs.get("token_type_ids")
        starts, lengths = query_start[:-1], np.diff(query_start)
        layout = self._layout
        if layout is not None:
            # Into row order, on the host: the graph takes its shape's slots; index inputs are int32 (the NPU's).
            source = torch.from_numpy(layout.source)
            padding = torch.from_numpy(layout.seq_ids.reshape(-1) < 0)
            input_ids = None if input_ids is None else input_ids[source]
            inputs_embeds = None if inputs_embeds is None else inputs_embeds[source]
            positions = positions[source].masked_fill(padding, 0).to(torch.int32)
            token_types = None if token_types is None else token_types[source]
            starts, lengths = layout.starts, layout.lengths
        image_slots = None
        if self.dual is not None and inputs_embeds is not None:
            source = None if layout is None else layout.source
            mask = image_token_mask(self.model)
            image_slots = step_inputs(self.dual, mask, source, starts, lengths, bucket)
            inputs_embeds = pad_width(inputs_embeds)
        # A traced graph's shapes depend on the bucket only; an untraced host step pools just its own requests.
        num_rows = self.max_requests(bucket) if self.bundled.traced else num_reqs
        weights = pooling_weights(self.methods, starts, lengths, bucket, num_rows)
        if self.compile_backend is not None:
            self.compile_backend.current_bucket = bucket if layout is None else _label(layout.shape)
        if layout is not None and layout.shape not in self.graph_costs:
            self.graph_costs[layout.shape] = count_flops(
                self._forward_and_pool, input_ids, positions, weights, token_types, inputs_embeds, image_slots
            )
        with strict_errors():
            hidden, self._pooled = self._graph(input_ids, positions, weights, token_types, inputs_embeds, image_slots)
        if layout is None:
            self.counters.record(bucket, real, bucket)
        else:
            cost = self.graph_costs[layout.shape]
            self.counters.record(_label(layout.shape), real, bucket, cost.flops, _useful(cost, layout))
        return hidden

    def _pool(self, hidden_states, num_scheduled_tokens, num_scheduled_tokens_np, kv_connector_output):
        pooled, self._pooled = self._pooled, None
        layout, self._layout = self._layout, None
        params = self.input_batch.get_pooling_params()
        if pooled is None or any(p.task not in self.heads for p in params):
            if layout is not None:  # vLLM's poolers read the step's tokens in its own order
                hidden_states = hidden_states[torch.from_numpy(layout.slot_of)]
            return super()._pool(hidden_states, num_scheduled_tokens, num_scheduled_tokens_np, kv_connector_output)
        num_reqs = self.input_batch.num_reqs
        prompt_lens = self.input_batch.num_prompt_tokens[:num_reqs]
        if not np.array_equal(num_scheduled_tokens_np[:num_reqs], prompt_lens):
            raise RuntimeError("The bundled runner needs whole prompts per step; chunked prefill must be off.")
        outputs: list[torch.Tensor | None] = []
        for i, p in enumerate(params):
            raw, activated = pooled[p.task]
            outputs.append(self.heads[p.task].finish(raw[i], activated[i], p).clone())
        return ModelRunnerOutput(
            req_ids=self.input_batch.req_ids.copy(),
            req_id_to_index=self.input_batch.req_id_to_index.copy(),
            kv_connector_output=kv_connector_output,
            pooler_output=outputs,
        )

    # -- warmup and stats ----------------------------------------------------------------------------------
    def finish_warmup(self) -> None:
        """Everything compiled so far belongs to warmup: count serving steps from zero."""
        self.counters = StepCounters()
        if self.compile_backend is not None:
            self.compile_backend.warmed_up = True
            cache_dir = self.bundled.cache_dir()
            if self.route == "torch.compile":
                rbln_runtime.save_compile_bundle(cache_dir)
            pins = artifacts.pins_for(self.bundled) if self.bundled.target == "rbln" else None
            artifacts.write(cache_dir, self.bundled.labels, self.compile_backend.graphs, pins)
            if self._compile_lock is not None:
                self._compile_lock.close()
                self._compile_lock = None

    def stats(self) -> dict[str, Any]:
        graphs = self.compile_backend.graphs if self.compile_backend is not None else []
        c = self.counters
        return {
            "runner": "bundled",
            "target": self.bundled.target,
            "kernels": self.bundled.kernels,
            "in_place_blocks": self.in_place_blocks,
            "fused_blocks": self.fused_blocks,
            "buckets": self.bundled.labels,
            "steps": c.steps,
            "steps_per_bucket": dict(sorted(c.steps_per_bucket.items())),
            "useful_tokens": c.useful_tokens,
            "computed_tokens": c.computed_tokens,
            "shapes": [list(s) for s in self.bundled.shapes],
            "useful_flops": c.useful_flops,
            "computed_flops": c.computed_flops,
            "graph_costs": {
                **{_label(s): dataclasses.asdict(c) for s, c in sorted(self.graph_costs.items())},
                **{label: dataclasses.asdict(c) for label, c in (self.vision.costs if self.vision else {}).items()},
            },
            "vision": None if self.vision is None else self.vision.describe(),
            "traced": self.bundled.traced,
            "compiles": len(graphs),
            "compiles_after_warmup": sum(g.after_warmup for g in graphs),
            "graph_breaks": graph_breaks() - self._graph_breaks_at_start if self.bundled.traced else 0,
            "graphs": [
                {
                    "bucket": g.bucket,
                    "input_shapes": g.input_shapes,
                    "after_warmup": g.after_warmup,
                    "ops": g.ops,
                    "lifted_weights": g.lifted_weights,
                }
                for g in graphs
            ],
            "pooling_in_graph": sorted(self.heads),
            "kv_cache_groups": {
                "scheduler": len(self.scheduler_kv_groups()),
                "runner_only": len(self.kv_cache_config.kv_cache_groups) - len(self.scheduler_kv_groups()),
            },
            # vLLM wraps the builder in a generated subclass for encoder-only layers: both names appear here.
            "attention_builders": sorted(
                {f"{type(b).__name__}({type(b).__mro__[1].__name__})" for b in self._attention_builders()}
            ),
            "attention": sorted({b.describe() for b in self._attention_builders()}),
            "compile_cache": {"dir": str(self.bundled.cache_dir()), "reused": self.cache_reused, **self._artifacts()},
            "compile_only": self.bundled.compile_only,
            "npu": self.bundled.npu,
            "route": self.route,
            "rbln_devices": rbln_runtime.visible_devices() if self.bundled.target == "rbln" else [],
        }

    @property
    def route(self) -> str | None:
        """How the rbln target's graphs are compiled for its NPU family ("aot" or "torch.compile")."""
        return rbln_runtime.family_of(self.bundled.npu).route if self.bundled.npu else None

    def _attention_builders(self) -> list[Any]:
        return [b for groups in self.attn_groups for g in groups for b in g.metadata_builders]

    def _artifacts(self) -> dict[str, int]:
        return rbln_runtime.artifact_counts(getattr(self.compile_backend, "inner", None))


def _label(shape: rows.Shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def _useful(cost: GraphCost, layout: rows.Layout) -> float:
    """The step's requests' FLOPs at their own lengths: the graph's token-linear FLOPs per token for each token,
    its attention FLOPs per (query, key) pair for each pair within a request."""
    tokens, width = layout.tokens, layout.shape[1]
    lengths = layout.lengths.astype(np.float64)
    per_token, per_pair = cost.linear_flops / tokens, cost.attention_flops / (tokens * width)
    return float(lengths.sum() * per_token + (lengths**2).sum() * per_pair)


def _process_groups() -> dict[str, list[int]]:
    """vLLM's process groups by name -> ranks, as rebel's torch.compile backend takes them (vllm-rbln 0.12)."""
    from vllm.distributed import get_dp_group, get_pp_group, get_tp_group

    return {
        group.group_name: list(coordinator.ranks)
        for coordinator in (get_tp_group(), get_pp_group(), get_dp_group())
        for group in (coordinator.device_group, coordinator.cpu_group)
    }


def _own_code(method: Any) -> Any:
    """``method`` bound to a copy of its code object. Dynamo keeps compiled graphs per code object, so runners of
    several engines in one process would otherwise share one graph cache: a new engine could be served a closed
    engine's graphs (its warmup compiling nothing), and live engines' buckets would add up to dynamo's limit."""
    fn = method.__func__
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(copy, method.__self__)


def _parameters(fn: Any) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)
