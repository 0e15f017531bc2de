"""The PyTorch backend: weights and the whole KV cache on one device (CUDA or the CPU).

Options (keyword arguments of `s2core.load(..., backend="torch")`):
  device      "cpu", "cuda", "cuda:N"; default $S2CORE_TORCH_DEVICE, else cuda if available
  dtype       compute precision: "f32" (default, $S2CORE_TORCH_DTYPE); on CUDA also "f16", "bf16"
  kv_cache_dtype                 "f16" (default, as s2.cpp), "bf16", "f32"; on the CPU an f16 or
                                 bf16 cache is held in float32 (rounded values; see kv_cache)
  single_token_semantic_prefill  None (auto), True, False: see `capabilities`
  quantized   GGUF's quantized types: "stored" (kept as their blocks, products computed from
              them: quantized.py) or "widen" (dequantized on load to f16 on the CPU, the
              compute dtype on CUDA); default $S2CORE_TORCH_QUANTIZED, else "stored" on CUDA
              with Triton, "widen" otherwise (plugin.default_quantized_mode says why)
  quant_kernels  products from stored blocks: "triton" (fused dequantizing GEMV + dequantize
                 for cuBLAS; CUDA, or the CPU under TRITON_INTERPRET=1) or "torch"
                 (dequantize per product into a reused buffer); default triton on CUDA when
                 installed
  arithmetic  "f32" (default: float32 activations, or the compute dtype) or "ggml" (s2.cpp's:
              8-bit activations and integer block dots, Triton on CUDA: ggml_products.py);
              "ggml" takes dtype="f32", quantized="stored", quant_kernels="triton"

On the CPU, matrix-vector products with f16/bf16 weights take activations of the weight's type
(torch's fast half GEMV; ggml does the same), so capabilities.compute_dtype says "f16" or "bf16"
for such files; multi-token products widen those weights to float32 at use (ops.Matmul).

The Fast-AR keeps its K/V between the calls of one frame (fast_begin / fast_extend): each call
runs only its new position, matrix-vector products at memory speed, instead of all of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from s2core.plugin import Backend, Capabilities
from s2core.plugin import ModelFile
from s2core.plugin import EvalBatch
from s2core.plugin import load_block
from s2core.plugin import available_host_memory_bytes

from . import ops, options
from .kv_cache import KVCache, SharedPrefix, storage_dtype
from .fast_ar import FastDecoder, FastState
from .layers import embed, finish_block, project_qkv
from .plugin import torch_capabilities
from .weights import WeightLoader

_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, model_file: ModelFile, device: Any = None, dtype: str | None = None,
                 kv_cache_dtype: str = "f16", single_token_semantic_prefill: bool | None = None,
                 quantized: str | None = None, quant_kernels: str | None = None,
                 arithmetic: str | None = None):
        super().__init__(model_file)
        opts = options.resolve(device, dtype, kv_cache_dtype, single_token_semantic_prefill,
                               quantized, quant_kernels, arithmetic)
        self.options = opts
        self.device = opts.device
        hp = self.hparams
        compute = options.TORCH_DTYPES[opts.compute_dtype]
        widened = compute if opts.on_cuda else torch.float16
        load = WeightLoader(model_file, self.device, widened,
                            keep_quantized=opts.quantized == "stored")

        self.embeddings = load.matrix("embeddings.weight")  # also the tied output matrix
        self.codebooks = load.matrix("codebook_embeddings.weight")
        self.norm = load.vector("norm.weight")
        self.layers = [load_block(f"layers.{i}", hp.attention_qk_norm, load.matrix, load.vector)
                       for i in range(hp.n_layer)]
        self.shape = hp.stack
        self.fast = None if hp.fast is None else FastDecoder(load, hp.fast)

        matrices = [self.embeddings] + [w for b in self.layers for w in b.matrices()]
        matrices += self.fast.matrices() if self.fast else []
        self.matmul = ops.Matmul(self.device, compute, opts.quant_kernels, opts.arithmetic)
        #: quantized tensors widened although kept as stored (infinite or NaN scales)
        self.widened_non_finite = tuple(load.widened_non_finite)
        self.output_product = ops.OutputProduct(self.matmul, self.device)
        # On the CPU, attention runs in float32: it streams K/V, not weights, and is a small
        # part of a step. On CUDA it takes the compute dtype (the flash kernels want halves).
        self.attention_dtype = compute if opts.on_cuda else torch.float32
        self.cache_dtype = options.TORCH_DTYPES[opts.kv_cache_dtype]
        self._cache: KVCache | None = None
        self._rope: torch.Tensor | None = None  # (max_seq_len, head_dim/2), with the cache
        # KV slots (slots.py): one KVCache per slot, and their rotations
        self._slots: list[KVCache] | None = None
        self._slot_rope: torch.Tensor | None = None
        self._prefixes = None  # slots.SharedPrefixes: voice prefixes held once for the slots
        self._caps = self._capabilities(matrices)

    def _capabilities(self, matrices: list) -> Capabilities:
        opts = self.options
        if opts.on_cuda or opts.arithmetic == "ggml":  # ggml: float32 steps (ops.Matmul)
            compute_name = opts.compute_dtype
        else:  # the coarsest activation type fed to a product (see ops.Matmul); stored
            # quantized weights multiply float32 activations on the CPU
            kinds = {w.dtype for w in matrices if isinstance(w, torch.Tensor)}
            compute_name = next((_DTYPE_NAMES[t] for t in (torch.bfloat16, torch.float16)
                                 if t in kinds), "f32")
        # s2.cpp prefills semantic positions one at a time on CUDA only because its quantized
        # embedding lookups there are unstable; here a lookup decodes its rows exactly as gguf
        # does (dequant.py), whether the table is kept quantized or widened: auto = off.
        single = bool(opts.single_token_semantic_prefill)
        n_layer = self.hparams.n_layer
        held = storage_dtype(self.cache_dtype, self.attention_dtype, hold_wide=not opts.on_cuda)
        return torch_capabilities(opts.device_name, compute_name, opts.kv_cache_dtype,
                                  n_accelerated_layers=n_layer if opts.on_cuda else 0,
                                  single_token_semantic_prefill=single,
                                  kv_cache_storage_dtype=_DTYPE_NAMES[held],
                                  quantized=opts.quantized, arithmetic=opts.arithmetic)

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    # ---------------------------------------------------------------- KV cache
    def allocate_kv_cache(self, max_seq_len: int) -> None:
        with torch.inference_mode():
            try:
                cache = self._new_cache(max_seq_len)
            except torch.cuda.OutOfMemoryError:
                if self._cache is None or not self.options.on_cuda:
                    raise
                # not beside the old one on the GPU: kv_cache_limit_bytes counted the old
                # cache's bytes as free, so free it and allocate again
                self.free_kv_cache()
                cache = self._new_cache(max_seq_len)
            self._cache, self._rope = cache

    def _new_cache(self, max_seq_len: int) -> tuple[KVCache, torch.Tensor]:
        hp = self.hparams
        cache = KVCache(hp.n_layer, hp.n_head_kv, max_seq_len, hp.head_dim, self.cache_dtype,
                        self.attention_dtype, self.device, hold_wide=not self.options.on_cuda)
        return cache, ops.rope_table(max_seq_len, hp.head_dim, hp.rope_freq_base, self.device)

    def kv_cache_limit_bytes(self) -> int | None:
        """On CUDA: the device's free memory, plus what torch's allocator keeps unused (the
        blocks of dropped tensors, such as a removed voice: it reuses them, and hands them back
        to the device before it reports running out), plus the cache, slots and shared voices
        held now (they can be freed first); on the CPU: available host memory, since
        torch.zeros touches every page."""
        if self.options.on_cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            dev = self.device
            free += torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
            caches = ([] if self._cache is None else [self._cache]) + (self._slots or [])
            held = sum(t.numel() * t.element_size() for c in caches for t in (c.k, c.v))
            shared = 0 if self._prefixes is None else self._prefixes.n_bytes()
            return free + held + shared
        return available_host_memory_bytes()

    def free_kv_cache(self) -> None:
        self._cache = None
        self._rope = None

    # ---------------------------------------------------------------- several sequences
    # (slots.py: one KVCache per slot; every weight read once for all the call's rows)
    def allocate_kv_slots(self, n_slots: int, max_seq_len: int) -> None:
        with torch.inference_mode():
            try:
                slots = [self._new_cache(max_seq_len)[0] for _ in range(n_slots)]
            except torch.cuda.OutOfMemoryError:
                if not self._slots or not self.options.on_cuda:
                    raise
                # kv_cache_limit_bytes counted the held slots as free: free them, again
                self.free_kv_slots()
                slots = [self._new_cache(max_seq_len)[0] for _ in range(n_slots)]
            rope = self._rope_table(max_seq_len)
            from .slots import SharedPrefixes
            self._slots, self._slot_rope, self._prefixes = slots, rope, SharedPrefixes()

    def _rope_table(self, n_positions: int) -> torch.Tensor:
        hp = self.hparams
        return ops.rope_table(n_positions, hp.head_dim, hp.rope_freq_base, self.device)

    def free_kv_slots(self) -> None:
        self._slots = None
        self._slot_rope = None
        self._prefixes = None

    # A voice prefix held once (kv_cache.SharedPrefix) and referenced by its slots: a slot's
    # own rows then hold the positions after it, so its positions reach n + max_seq_len.
    def add_kv_prefix(self, k: np.ndarray, v: np.ndarray) -> int:
        with torch.inference_mode():
            held = self._slots[0].held_dtype
            prefix = SharedPrefix(k, v, held, self.device)
            reach = prefix.n + self._slots[0].max_seq_len
            rope = self._slot_rope
            if rope.shape[0] < reach:  # rows are per position: a longer table adds rows only
                rope = self._rope_table(reach)
            handle = self._prefixes.add(prefix)
            self._slot_rope = rope
            return handle

    def attach_kv_prefix(self, slot: int, handle: Any) -> None:
        self._slots[slot].prefix = None if handle is None else self._prefixes.get(handle)

    def remove_kv_prefix(self, handle: Any) -> None:
        self._prefixes.remove(handle, self._slots)

    def read_kv_slot(self, slot: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            return self._slots[slot].read(n_positions)

    def write_kv_slot(self, slot: int, k: np.ndarray, v: np.ndarray) -> None:
        with torch.inference_mode():
            self._slots[slot].write(k, v)

    @torch.inference_mode()
    def eval_slots(self, batches: list[tuple[int, EvalBatch]]
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from .slots import eval_slots
        return eval_slots(self, self._slots, self._slot_rope, batches)

    @torch.inference_mode()
    def fast_decode_batch(self, hiddens: np.ndarray, prefix_codes: np.ndarray) -> torch.Tensor:
        state, logits = self.fast_begin_batch(hiddens)
        for c in range(prefix_codes.shape[1]):
            state, logits = self.fast_extend_batch(state, prefix_codes[:, c])
        return logits

    @torch.inference_mode()
    def fast_begin_batch(self, hiddens: Any):
        return self.fast.begin_batch(torch.as_tensor(hiddens, device=self.device).float(),
                                     self.attention_dtype, self.matmul, self.output_product)

    @torch.inference_mode()
    def fast_extend_batch(self, state, codes: np.ndarray):
        return state, self.fast.extend_batch(state, self._fast_codes(codes), self.matmul,
                                             self.output_product)

    def read_kv_cache(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            return self._cache.read(n_positions)

    def write_kv_cache(self, k: np.ndarray, v: np.ndarray) -> None:
        with torch.inference_mode():
            self._cache.write(k, v)

    # ---------------------------------------------------------------- compute
    def _embed(self, batch: EvalBatch) -> torch.Tensor:
        return embed(self.embeddings, self.codebooks, batch, self.device)

    @torch.inference_mode()
    def eval_cached(self, batch: EvalBatch) -> tuple[torch.Tensor, torch.Tensor]:
        s, cache, mm = self.shape, self._cache, self.matmul
        n, n_past = batch.n_tokens, batch.n_past
        rotations = self._rope[n_past:n_past + n]
        mask = ops.causal_mask(n, n_past, self.device)
        x = self._embed(batch)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            q, k, v = project_qkv(x, blk, s, rotations, mm)
            keys, values = cache.update(i, n_past, k, v)
            if i == last and n > 1:
                # Only the last position reaches the output: skip the others' final block.
                x, q, mask = x[-1:], q[-1:], None
            attn = ops.attention(q.to(self.attention_dtype), keys, values, mask, s.attn_scale)
            cache.settle(i, n_past, n_past + n)
            x = finish_block(x, attn, blk, s.eps, mm)
        hidden = ops.rms_norm(x[-1], self.norm, s.eps)
        return hidden, self.output_product(self.embeddings, hidden)

    @torch.inference_mode()
    def fast_decode(self, hidden: Any, prefix_codes: np.ndarray) -> torch.Tensor:
        """Every position in one pass, as s2.cpp does (the core calls the two below instead)."""
        state = self.fast.new_state(self.attention_dtype)
        return self.fast.advance(state, self._fast_first(hidden), self._fast_codes(prefix_codes),
                                 self.matmul, self.output_product)

    def fast_begin(self, hidden: Any) -> tuple[FastState, torch.Tensor]:
        return self.fast_start(hidden, np.zeros(0, np.int64))

    @torch.inference_mode()
    def fast_start(self, hidden: Any, codes: np.ndarray) -> tuple[FastState, torch.Tensor]:
        """Position 0 and the codes after it in one pass (a frame's first call: two rows per
        weight read instead of two reads)."""
        state = self.fast.new_state(self.attention_dtype)
        logits = self.fast.advance(state, self._fast_first(hidden), self._fast_codes(codes),
                                   self.matmul, self.output_product)
        return state, logits

    @torch.inference_mode()
    def fast_extend(self, state: FastState, codes: np.ndarray) -> tuple[FastState, torch.Tensor]:
        logits = self.fast.advance(state, None, self._fast_codes(codes), self.matmul,
                                   self.output_product)
        return state, logits

    def _fast_first(self, hidden: Any) -> torch.Tensor:
        return torch.as_tensor(hidden, device=self.device).float()

    def _fast_codes(self, codes: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(codes, dtype=np.int64)).to(self.device)

    # ---------------------------------------------------------------- host hand-off
    def to_numpy(self, x: Any) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float32).numpy()
        return np.asarray(x, dtype=np.float32)
