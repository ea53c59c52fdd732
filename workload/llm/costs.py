"""FLOPs and bytes of the kernels of one transformer layer, for the roofline model.

Counting conventions:
- A matmul of an (m x k) by a (k x n) matrix is 2mkn FLOPs. Its backward is two matmuls of the same size:
  the input gradient (dgrad) and the weight gradient (wgrad). Bytes = both inputs read + the output written.
- Attention scores are counted with causal masking: query i attends to keys 0..i, so a sequence of s tokens
  has s(s+1)/2 (query, key) pairs per head, each costing 2 x head_dim FLOPs in QK^T and again in AV.
  Per token and layer that is 2 x heads x head_dim x (s+1) FLOPs forward; backward is twice that
  (dQ, dK, dV and dP). The kernel is a fused (FlashAttention-style) one: it reads Q, K, V and writes O
  forward (plus O, dO, dQ, dK, dV backward); its softmax arithmetic is not counted as FLOPs.
- Elementwise kernels (norms with the residual add, activations, embedding lookup, loss) have a small
  per-element FLOP count (the constants below are estimates) and are memory-bound: they matter for the
  roofline time, hardly for the FLOP total, and are reported apart from the matmul FLOPs.

Every kernel also carries its operator shape (compute/shapes.py: GEMM m/n/k/batch, attention dimensions,
the operator class and precision), which the trace writer stores as Chakra attributes for
``--compute-model kernels``; ``flops`` and ``size_bytes`` stay the generator's counts (num_ops, tensor_size).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from compute.shapes import AttentionShape, GemmShape, OpShape, dtype_for_bytes

# Estimated FLOPs per element of the elementwise kernels (forward; backward is BACKWARD_FACTOR times that).
NORM_FLOPS = {"layernorm": 8, "rmsnorm": 5}  # includes the residual add fused into the norm
ROPE_FLOPS = 3  # two products and a sum per element
ROPE_UNFUSED_PASSES = 13  # tensors' worth of bytes read and written by the unfused RoPE (see rope())
# Megatron-Core's clamped GLU (GPT-OSS): the two halves clamped (each read and written) and concatenated again
# (read and written) before the fused activation; backward, each half's clamp gradient reads the output gradient
# and the saved input and writes the input gradient (the concatenation's gradient is a view)
CLAMP_PASSES = (4, 3)
# the experts' second-layer bias scaled by the routing probabilities, per expert (TEGroupedMLP._apply_bias): the
# scaled bias written, added to the output (two reads, a write), the experts' pieces concatenated (read, write);
# backward, the product's gradients: output gradient times probabilities (read, write) and its sum over the
# tokens (read), output gradient times bias (read, write) and its sum over the features (read)
SCALED_BIAS_PASSES = (5, 6)
ACTIVATION_FLOPS = {False: 8, True: 5}  # GELU (tanh form) / SwiGLU (SiLU of the gate times the up projection)
LOSS_FLOPS = 5  # max, subtract, exp, sum, log per logit
BACKWARD_FACTOR = 2
# Mixed-precision Adam per parameter: FLOPs of the update, and bytes touched (read fp32 master weight,
# momentum, variance and gradient = 16; write master, momentum, variance and the bf16 weight = 14).
ADAM_FLOPS_PER_PARAM = 12
ADAM_BYTES_PER_PARAM = 30
# The operator class of an elementwise kernel, by its name (names not listed are plain "elementwise").
ELEMENTWISE_CLASSES = {"norm": "norm", "final_norm": "norm", "activation": "activation", "loss": "loss",
                       "embedding": "embedding", "softmax": "softmax"}


@dataclass(frozen=True, slots=True)
class Kernel:
    """One compute node's work: ``category`` is matmul (with parameters), attention (scores), elementwise
    or optimizer; ``shape`` what the kernel compute model times (None: only flops and bytes are known)."""

    name: str
    category: str
    flops: int
    size_bytes: int
    shape: OpShape | None = None

    def attributes(self) -> list[tuple[str, object]]:
        """The kernel's Chakra attributes beyond num_ops and tensor_size (its shape; none without one)."""
        return self.shape.attributes() if self.shape is not None else []


@dataclass(frozen=True, slots=True)
class Matmul:
    """A layer's weight applied to ``tokens`` rows: (tokens x k) @ (k x n). ``weights`` > 1: a grouped matmul
    over that many experts' weights (the tokens are split evenly between them). ``dtype`` is the math
    precision ("fp8", "bf16", ...; blank: the usual one of ``dtype_bytes``)."""

    name: str
    tokens: int
    k: int
    n: int
    dtype_bytes: int
    weights: int = 1
    dtype: str = ""
    streams: int = 0  # a grouped matmul run as one GEMM per weight, this many at a time (0: one batched kernel)
    # bytes per element of the weight's main gradient, which the weight gradient is added into (Megatron's gradient
    # accumulation fusion: read and written every micro-batch); 0: written once (no weight, as the Mamba-2 scan's)
    grad_bytes: int = 0

    @property
    def flops(self) -> int:
        return 2 * self.tokens * self.k * self.n

    @property
    def size_bytes(self) -> int:
        return (self.tokens * self.k + self.weights * self.k * self.n + self.tokens * self.n) * self.dtype_bytes

    def _kernel(self, name: str, m: int, n: int, k: int, accumulate_bytes: int = 0) -> Kernel:
        gemm = GemmShape(m, n, k, self.weights, self.streams, accumulate_bytes)
        shape = OpShape("gemm", self.dtype or dtype_for_bytes(self.dtype_bytes), gemm=gemm)
        return Kernel(name, "matmul", self.flops, self.size_bytes, shape)

    def forward(self) -> Kernel:
        """Y = X W: (tokens x k) @ (k x n), per expert for grouped matmuls."""
        return _pass_kernel(self, "forward")

    def dgrad(self) -> Kernel:
        """dX = dY W^T: (tokens x n) @ (n x k)."""
        return _pass_kernel(self, "dgrad")

    def wgrad(self) -> Kernel:
        """dW = X^T dY: (k x tokens) @ (tokens x n), reducing over the tokens (and added into the main gradient)."""
        return _pass_kernel(self, "wgrad")

    @property
    def _rows(self) -> int:
        return -(-self.tokens // self.weights)


@lru_cache(maxsize=4096)
def _pass_kernel(matmul: Matmul, which: str) -> Kernel:
    """The (immutable) kernel of one pass of ``matmul``: a generator asks for the same few shapes once per layer
    and micro-batch, millions of times in a large iteration."""
    rows = matmul._rows
    if which == "forward":
        return matmul._kernel(matmul.name, rows, matmul.n, matmul.k)
    if which == "dgrad":
        return matmul._kernel(matmul.name + "_dgrad", rows, matmul.k, matmul.n)
    return matmul._kernel(matmul.name + "_wgrad", matmul.k, matmul.n, rows, matmul.grad_bytes)


def attention_flops(batch: int, seq_len: int, heads: int, head_dim: int) -> int:
    """Forward FLOPs of causal QK^T and AV for ``batch`` sequences: 2 matmuls x 2 x head_dim per pair."""
    return 2 * 2 * head_dim * heads * batch * (seq_len * (seq_len + 1) // 2)


def attention(batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int, dtype_bytes: int,
              *, seq_kv: int | None = None, causal: bool = True, dtype: str = "", window: int = 0,
              flash: bool = True) -> tuple[Kernel, Kernel]:
    """(forward, backward) of the attention kernel over ``heads`` query and ``kv_heads`` key/value heads.
    ``seq_kv`` (default ``seq_len``): the keys the queries see, for a kernel owning only part of the sequence
    (context parallelism); the shape then says so, ``flops`` and bytes stay those of ``seq_len`` queries.
    ``window``: sliding-window attention (each query sees that many keys, itself included; FLOPs counted over
    the pairs it computes); ``flash`` False: the unfused kernels that materialise the scores."""
    tokens = batch * seq_len
    q_bytes = tokens * heads * head_dim * dtype_bytes
    kv_bytes = tokens * kv_heads * head_dim * dtype_bytes
    dtype = dtype or dtype_for_bytes(dtype_bytes)

    def shape(backward: bool) -> OpShape:
        dims = AttentionShape(batch, heads, kv_heads, head_dim, seq_len, seq_kv or seq_len, causal, backward,
                              flash, window)
        return OpShape("attention", dtype, attention=dims)

    flops = attention_flops(batch, seq_len, heads, head_dim)
    if window:
        flops = 4 * head_dim * heads * batch * AttentionShape(1, 1, 1, 1, seq_len, seq_len, causal, window=window).pairs

    forward = Kernel("attention", "attention", flops, 2 * q_bytes + 2 * kv_bytes, shape(False))
    backward = Kernel("attention_bwd", "attention", BACKWARD_FACTOR * flops, 4 * q_bytes + 4 * kv_bytes, shape(True))
    return forward, backward


def elementwise(name: str, elements: int, flops_per_element: int, tensors_read: int, tensors_written: int,
                dtype_bytes: int, *, op_class: str = "") -> tuple[Kernel, Kernel]:
    """(forward, backward) of a kernel touching ``elements`` values per tensor. Backward reads the output
    gradient and the saved inputs and writes the input gradients. ``op_class``: norm, activation, loss,
    embedding, softmax or elementwise (blank: by ``name``, see ELEMENTWISE_CLASSES)."""
    shape = OpShape(op_class or ELEMENTWISE_CLASSES.get(name, "elementwise"), dtype_for_bytes(dtype_bytes))
    forward = Kernel(name, "elementwise", elements * flops_per_element,
                     elements * (tensors_read + tensors_written) * dtype_bytes, shape)
    backward = Kernel(name + "_bwd", "elementwise", elements * flops_per_element * BACKWARD_FACTOR,
                      elements * (tensors_written + 2 * tensors_read) * dtype_bytes, shape)
    return forward, backward


def tensor_passes(name: str, elements: int, passes: tuple[int, int], dtype_bytes: int) -> tuple[Kernel, Kernel]:
    """(forward, backward) of an unfused chain of plain PyTorch kernels over a tensor of ``elements`` values that
    reads and writes ``passes`` (forward, backward) tensors' worth of bytes in all (a FLOP per element each way)."""
    shape = OpShape("elementwise", dtype_for_bytes(dtype_bytes))
    forward = Kernel(name, "elementwise", elements, elements * passes[0] * dtype_bytes, shape)
    backward = Kernel(name + "_bwd", "elementwise", elements, elements * passes[1] * dtype_bytes, shape)
    return forward, backward


def rope(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype_bytes: int, fused: bool = True
         ) -> tuple[Kernel, Kernel]:
    """(forward, backward) of the rotary position embedding on a rank's queries and keys (backward: the same
    rotation on their gradients). Fused (Transformer Engine's kernel): each element read and written once.
    Unfused (Megatron-Core's PyTorch RoPE, ``t * cos + rotate_half(t) * sin``): the products, the half rotation
    (negation and concatenation), the sum and the final concatenation read about 7.5 and write 5.5 tensors' worth
    (ROPE_UNFUSED_PASSES); its autograd backward about the same."""
    elements = tokens * (heads + kv_heads) * head_dim  # queries and keys (values are not rotated)
    passes = 2 if fused else ROPE_UNFUSED_PASSES
    shape = OpShape("elementwise", dtype_for_bytes(dtype_bytes))
    forward = Kernel("rope", "elementwise", elements * ROPE_FLOPS, elements * passes * dtype_bytes, shape)
    backward = Kernel("rope_bwd", "elementwise", elements * ROPE_FLOPS, elements * passes * dtype_bytes, shape)
    return forward, backward


def cross_entropy(tokens: int, vocab: int, dtype_bytes: int) -> tuple[Kernel, Kernel]:
    """(forward, backward) of the vocabulary-parallel cross entropy as Megatron-LM computes it, in fp32 over the
    ``tokens x vocab`` logits: forward casts them to fp32 (read ``dtype_bytes``, write 4), takes the max (read 4),
    subtracts it, exponentiates and divides by the sum in place (read and write 4 each, the sum reads 4 more) and
    keeps the softmax; backward scales it by the loss gradient in place and casts it back (read 4, write
    ``dtype_bytes``): 36 + b bytes per logit forward, 12 + b backward, where one pass each was counted before."""
    elements = tokens * vocab
    shape = OpShape("loss", "fp32")
    forward = Kernel("loss", "elementwise", elements * LOSS_FLOPS, elements * (dtype_bytes + 36), shape)
    backward = Kernel("loss_bwd", "elementwise", elements * LOSS_FLOPS * BACKWARD_FACTOR, elements * (dtype_bytes + 12),
                      shape)
    return forward, backward


def optimizer(params: int) -> Kernel:
    """A mixed-precision Adam step over ``params`` parameters."""
    return Kernel("optimizer", "optimizer", params * ADAM_FLOPS_PER_PARAM, params * ADAM_BYTES_PER_PARAM,
                  OpShape("optimizer", "fp32"))
