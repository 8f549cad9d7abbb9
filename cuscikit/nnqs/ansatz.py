"""The NNQS wavefunction: an autoregressive transformer amplitude times an MLP phase.

A determinant is read as a sequence of ``norb`` tokens, one per spatial orbital,
``t_k = n_k,alpha + 2 n_k,beta`` in {0, 1, 2, 3}. The amplitude is a decoder-only transformer that
gives the conditional distributions ``p(t_k | t_<k)``; tokens that would make the alpha or beta
electron count impossible are masked to -inf before the softmax, so

    ln|psi(x)| = 1/2 sum_k log p(t_k | t_<k)

is exactly normalised over the fixed-(N_alpha, N_beta) sector (sum_x |psi(x)|^2 = 1). The phase is
an MLP on the +/-1 spin-orbital occupation vector. ``log_psi(x) = ln|psi(x)| + i phi(x)``.

Configurations follow `cuscikit.sci.configs`: ``uint64`` arrays of shape (n, words), interleaved
spin orbitals (bit 2p is orbital p alpha, bit 2p+1 orbital p beta, spin orbital k in word k // 64).

Example:
    >>> import numpy as np, torch
    >>> from cuscikit.sci.configs import all_determinants
    >>> psi = Ansatz(4, (2, 1), seed=0, dtype=torch.float64)
    >>> x = all_determinants(4, (2, 1))
    >>> with torch.no_grad():
    ...     norm = torch.exp(2 * psi.log_psi(x).real).sum().item()
    >>> abs(norm - 1) < 1e-12
    True
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cuscikit.backends import resolve_device
from cuscikit.nnqs import aside, fused_ops
from cuscikit.sci.configs import from_bits, n_words, normalize_nelec, to_bits

__all__ = ["Ansatz", "PrefixTree", "allowed_tokens", "prefix_tree", "reuse_token_work"]

#: Alpha and beta occupation of each of the four tokens (t = n_alpha + 2 n_beta).
_TOKEN_ALPHA = (0, 1, 0, 1)
_TOKEN_BETA = (0, 0, 1, 1)
_INIT_STD = 0.02  # GPT-2 style initialisation of the transformer


def allowed_tokens(
    used_alpha: torch.Tensor,
    used_beta: torch.Tensor,
    n_alpha: int,
    n_beta: int,
    remaining: torch.Tensor | int,
) -> torch.Tensor:
    """Which of the four tokens keep the (N_alpha, N_beta) sector reachable.

    A token is allowed when, after choosing it, no more than N electrons of either spin are used
    and the electrons still missing fit in the orbitals that follow.

    Args:
        used_alpha: alpha electrons in the prefix before this orbital (any shape, integer).
        used_beta: beta electrons in the prefix, same shape (or broadcastable).
        n_alpha: alpha electrons of the sector.
        n_beta: beta electrons of the sector.
        remaining: orbitals after this one (broadcastable to ``used_alpha``).

    Returns:
        bool tensor of shape ``used_alpha.shape + (4,)``.

    Example:
        >>> allowed_tokens(torch.tensor([0]), torch.tensor([1]), 1, 1, 0)   # last orbital
        tensor([[False,  True, False, False]])
    """
    dev = used_alpha.device
    token = torch.arange(4, device=dev)  # made on the device: no host copy (CUDA graphs)
    da, db = token & 1, token >> 1  # _TOKEN_ALPHA, _TOKEN_BETA
    if not isinstance(remaining, torch.Tensor):
        remaining = torch.tensor(remaining, device=dev)
    ua = used_alpha.unsqueeze(-1) + da  # alpha electrons used after choosing each token
    ub = used_beta.unsqueeze(-1) + db
    rem = remaining.unsqueeze(-1)
    return (ua <= n_alpha) & (n_alpha - ua <= rem) & (ub <= n_beta) & (n_beta - ub <= rem)


class _TokenWork(NamedTuple):
    """What the amplitude's pass over token rows computes from the tokens alone."""

    inputs: torch.Tensor  # (n, L): the start token, then tokens[:, :-1]
    softmax_fill: torch.Tensor  # (n, L, 4) bool: set to -inf before the softmax
    out_fill: torch.Tensor  # (n, L, 4) bool: impossible tokens, -inf after it


_reuse = threading.local()  # .cache: {key: (ansatz, tokens, value)} in `reuse_token_work`


@contextlib.contextmanager
def reuse_token_work():
    """Within (in this thread): passes of an `Ansatz` over the same token tensor, unchanged,
    compute its masks, shifted inputs and phase input once and reuse them. The recorded
    optimiser stage makes up to 17 passes over one S; each would otherwise repeat some thirty
    small kernels that depend on the tokens alone. A tensor written in place between passes
    is computed again (the key holds its version counter).

    Example:
        >>> psi = Ansatz(4, (2, 1), seed=0, dtype=torch.float64)
        >>> tok = psi.tokens(psi.sample(8)[0])
        >>> with reuse_token_work():
        ...     a, b = psi._token_work(tok), psi._token_work(tok)
        >>> a is b, psi._token_work(tok) is a
        (True, False)
    """
    saved = getattr(_reuse, "cache", None)
    _reuse.cache = {}
    try:
        yield
    finally:
        _reuse.cache = saved


class PrefixTree(NamedTuple):
    """The distinct prefixes of a batch of token sequences (`prefix_tree`).

    Attributes:
        node: int64 (n, L): the prefix ``tokens[i, :p]`` of sequence i at position p as a row
            index among the distinct prefixes (position-major: row 0 is the empty prefix).
        first: int64 (M,): for each distinct prefix, the flat index ``i * L + p`` of its first
            occurrence in the batch.
    """

    node: torch.Tensor
    first: torch.Tensor


def prefix_tree(tokens: torch.Tensor) -> PrefixTree:
    """The distinct prefixes of ``tokens`` (n, L): in an autoregressive model the state at
    position p depends on the tokens before p alone, so sequences that share a prefix share
    everything computed there (`Ansatz.log_amplitude` with ``tree=``). Sorted configurations
    share long prefixes: 164,000 configurations of the 12-site Hubbard ring hold 483,000
    distinct prefixes against 1,968,000 positions (docs/performance.md).

    Example:
        >>> t = prefix_tree(torch.tensor([[0, 1, 2], [0, 1, 3], [0, 2, 3]]))
        >>> t.node.tolist(), len(t.first)    # "", "0", "01", "02"
        ([[0, 1, 2], [0, 1, 2], [0, 1, 3]], 4)
    """
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(
            f"tokens must be an integer tensor (n, L), got {tokens.dtype} {tuple(tokens.shape)}"
        )
    if tokens.numel() and not bool(((tokens >= 0) & (tokens < 4)).all()):
        raise ValueError("tokens must lie in 0..3")
    n, length = tokens.shape
    dev = tokens.device
    node = torch.zeros((n, length), dtype=torch.long, device=dev)
    inv = torch.zeros(n, dtype=torch.long, device=dev)
    rows = 1 if n else 0
    for p in range(1, length):
        # a prefix of p tokens: its parent (p - 1 tokens) and its last token
        u, inv = torch.unique(inv * 4 + tokens[:, p - 1], return_inverse=True)
        node[:, p] = inv + rows
        rows += len(u)
    first = torch.full((rows,), n * length, dtype=torch.long, device=dev)
    flat = torch.arange(n * length, device=dev)
    first.scatter_reduce_(0, node.reshape(-1), flat, reduce="amin")
    return PrefixTree(node, first)


_SHORT_SEQUENCE = 64  # orbitals up to which attention is computed without the fused kernel


class _Linear(nn.Linear):
    """`nn.Linear` (same parameters and state) whose weight and bias gradients go to a second
    CUDA stream inside `cuscikit.nnqs.aside.gradients_aside` (the recorded optimiser stage)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return aside.linear(x, self.weight, self.bias)


class _CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = _Linear(d_model, 3 * d_model)
        self.proj = _Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.attend(self.qkv(x)))

    def attend(self, qkv: torch.Tensor) -> torch.Tensor:
        """Causal softmax attention (n, L, d) of every head from the projection ``qkv``
        (n, L, 3d), before the output projection."""
        n, length, d3 = qkv.shape
        d = d3 // 3
        if length <= _SHORT_SEQUENCE:  # a training pass on a GPU: one Triton kernel each way
            y = fused_ops.causal_attention(qkv, self.n_heads)
            if y is not None:
                return y
        q, k, v = qkv.split(d, dim=-1)
        shape = (n, length, self.n_heads, d // self.n_heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        if length <= _SHORT_SEQUENCE:
            # Written out: for a few dozen orbitals and head widths of ~8, the fused kernels'
            # 64x64 tiles are mostly padding (on an H200 the fused kernel took 41 % of an
            # inference pass); batched matmuls and one softmax are several times faster.
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
            future = torch.ones(length, length, dtype=torch.bool, device=qkv.device).triu(1)
            y = torch.softmax(att.masked_fill(future, -math.inf), dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(n, length, d)

    def step(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One new position ``x`` (n, 1, d) attending to the cached keys/values and itself."""
        n, _, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        shape = (n, 1, self.n_heads, d // self.n_heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k = torch.cat((cache[0], k), dim=2)
            v = torch.cat((cache[1], v), dim=2)
        y = F.scaled_dot_product_attention(q, k, v)  # the last position sees everything
        return self.proj(y.transpose(1, 2).reshape(n, 1, d)), (k, v)


class _LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters and state) whose training pass on a GPU takes the
    Triton kernels of `cuscikit.nnqs.fused_ops` (torch's kernels elsewhere)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_ops.layer_norm(x, self.weight, self.bias, self.eps)


class _Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = _LayerNorm(d_model)
        self.attn = _CausalSelfAttention(d_model, n_heads)
        self.ln2 = _LayerNorm(d_model)
        self.fc = _Linear(d_model, 4 * d_model)
        self.proj = _Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_ops.block(x, self)  # when switched on: one kernel each way
        if fused is not None:
            return fused
        return self._mlp(x + self.attn(self.ln1(x)))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP half with its residual sum: x + mlp(ln2(x)) (row by row)."""
        return x + self.ff(self.ln2(x))

    def ff(self, y: torch.Tensor) -> torch.Tensor:
        """The MLP itself on normalised rows ``y``: proj(gelu(fc(y))) (`aside.mlp`)."""
        return aside.mlp(y, (self.fc, self.proj))

    def shared(self, h: torch.Tensor, tree: PrefixTree) -> torch.Tensor:
        """`forward` on the rows ``h`` (M, d) of the distinct prefixes of `tree`: every
        row-wise part once a prefix, the attention over the sequences' (n, L) layout."""
        n, length = tree.node.shape
        qkv = self.attn.qkv(self.ln1(h))[tree.node]  # (n, L, 3d), each row its prefix's
        y = self.attn.attend(qkv)
        y = y.reshape(n * length, y.shape[-1])[tree.first]
        return self._mlp(h + self.attn.proj(y))

    def step(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        a, cache = self.attn.step(self.ln1(x), cache)
        return self._mlp(x + a), cache


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class Ansatz(nn.Module):
    """Autoregressive transformer amplitude and MLP phase over a fixed (N_alpha, N_beta) sector.

    Args:
        norb: number of spatial orbitals (sequence length).
        nelec: electrons, an int (lowest Ms: n_alpha = ceil(n/2)) or a pair (n_alpha, n_beta).
        d_model: transformer width. Default 32, or 48 for cc-pVDZ-size systems (norb >= 24).
        n_layers: transformer blocks (default 4).
        n_heads: attention heads. Default 4 (6 when norb >= 24); when ``d_model`` is given and
            the default does not divide it, the largest smaller divisor of ``d_model``.
        phase_hidden: widths of the hidden layers of the phase MLP (GELU activations).
        dtype: floating dtype of the parameters; ``log_psi`` returns the matching complex dtype.
        device: where the parameters live (default: torch's default device).
        seed: seeds a local generator for the initialisation; ``None`` draws that seed from
            torch's global RNG, so ``torch.manual_seed`` also makes it reproducible. Either way
            the global RNG state is otherwise left untouched.

    Raises:
        ValueError: on electron counts that do not fit, non-positive sizes, ``d_model`` not
            divisible by ``n_heads``, a non-floating dtype or an unusable device.

    Example:
        >>> psi = Ansatz(6, (3, 2), seed=1)
        >>> configs, counts = psi.sample(1000)
        >>> int(counts.sum()), psi.log_psi(configs).dtype
        (1000, torch.complex64)
    """

    def __init__(
        self,
        norb: int,
        nelec: int | Sequence[int],
        *,
        d_model: int | None = None,
        n_layers: int = 4,
        n_heads: int | None = None,
        phase_hidden: Sequence[int] = (512, 512, 512),
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        seed: int | None = None,
        reference: np.ndarray | None = None,
        reference_bias: float = 0.0,
    ) -> None:
        super().__init__()
        norb = _check_positive_int("norb", norb)
        self._words = n_words(norb)  # raises past the supported bit width
        self._norb = norb
        self._nelec = normalize_nelec(nelec, norb)
        large = norb >= 24  # cc-pVDZ-size systems get the wider default
        default_heads = 6 if large else 4
        if d_model is None:
            d_model = 48 if large else 32
        d_model = _check_positive_int("d_model", d_model)
        n_layers = _check_positive_int("n_layers", n_layers)
        if n_heads is None:
            n_heads = max(h for h in range(1, default_heads + 1) if d_model % h == 0)
        n_heads = _check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if isinstance(phase_hidden, (int, np.integer)):
            phase_hidden = (phase_hidden,)
        phase_hidden = tuple(_check_positive_int("phase_hidden entry", h) for h in phase_hidden)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.is_complex:
            raise ValueError(f"dtype must be a real floating torch dtype, got {dtype!r}")
        dev = resolve_device(device)
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.phase_hidden = phase_hidden

        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        generator = torch.Generator().manual_seed(int(seed))
        # Build on the CPU in float64 with a local generator, then move: the same seed gives the
        # same function on every device and dtype, and the global RNG is not consumed.
        with torch.random.fork_rng(devices=[]):
            self._build(generator)
        if reference is not None and reference_bias:
            self._bias_towards(reference, float(reference_bias))
        self.to(device=dev, dtype=dtype)

        # Index buffers of `tokens`: spin orbital s = 2k + spin sits in word s // 64, bit s % 64.
        so = torch.arange(2 * norb)
        self.register_buffer("_word_index", (so // 64).to(device=dev), persistent=False)
        self.register_buffer("_bit_shift", (so % 64).to(device=dev), persistent=False)
        self.register_buffer(
            "_remaining", torch.arange(norb - 1, -1, -1, device=dev), persistent=False
        )

    def _build(self, generator: torch.Generator) -> None:
        d, norb = self.d_model, self._norb
        f64 = torch.float64
        self.token_embedding = nn.Embedding(5, d, dtype=f64)  # 4 tokens + the start token
        self.position_embedding = nn.Embedding(norb, d, dtype=f64)
        self.blocks = nn.ModuleList(_Block(d, self.n_heads).double() for _ in range(self.n_layers))
        self.ln_f = _LayerNorm(d, dtype=f64)
        self.head = _Linear(d, 4, dtype=f64)
        # Per-position logit offsets: zero, or tilted towards a reference determinant.
        self.logit_bias = nn.Parameter(torch.zeros(norb, 4, dtype=f64))
        widths = (2 * norb, *self.phase_hidden)
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [_Linear(a, b, dtype=f64), nn.GELU()]
        layers.append(_Linear(widths[-1], 1, dtype=f64))
        self.phase_net = nn.Sequential(*layers)

        with torch.no_grad():
            residual_std = _INIT_STD / math.sqrt(2 * self.n_layers)
            for name, m in self.named_modules():
                if name.startswith("phase_net") or not isinstance(m, (nn.Linear, nn.Embedding)):
                    continue  # LayerNorms keep their deterministic (1, 0) initialisation
                std = residual_std if name.endswith("proj") else _INIT_STD  # GPT-2 scaling
                m.weight.normal_(0.0, std, generator=generator)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            for m in self.phase_net:
                if isinstance(m, nn.Linear):  # PyTorch's default scale, local generator
                    bound = 1.0 / math.sqrt(m.in_features)
                    m.weight.uniform_(-bound, bound, generator=generator)
                    m.bias.uniform_(-bound, bound, generator=generator)

    def _bias_towards(self, reference: np.ndarray, strength: float) -> None:
        """Tilt the initial conditionals towards `reference` (e.g. the Hartree-Fock
        determinant): its token gets `strength` extra logit at every position, so the starting
        wavefunction is dominated by it instead of spread evenly over the sector."""
        ref = np.asarray(reference, dtype=np.uint64).reshape(1, -1)
        if ref.shape[1] != self._words:
            raise ValueError(f"reference must be one configuration of {self._words} words")
        bits = to_bits(ref, self._norb)[0].astype(np.int64)
        tokens = torch.from_numpy(bits[0::2] + 2 * bits[1::2])
        with torch.no_grad():
            self.logit_bias[torch.arange(self._norb), tokens] = strength

    # ------------------------------------------------------------------ properties
    @classmethod
    def for_molecule(cls, mol: Any, **kw: Any) -> Ansatz:
        """Build an ansatz for ``mol`` (anything with ``norb`` and ``nelec``, e.g. a
        `cuscikit.chem.Molecule`); keyword arguments go to the constructor. By default the
        initial wavefunction leans towards the determinant a run starts from
        (``reference_bias=DEFAULT_REFERENCE_BIAS``; `cuscikit.sci.configs.start_configuration`:
        the Hartree-Fock determinant unless the molecule's metadata names another)."""
        from cuscikit.nnqs.defaults import DEFAULT_REFERENCE_BIAS
        from cuscikit.sci.configs import start_configuration

        kw.setdefault("reference", start_configuration(mol))
        kw.setdefault("reference_bias", DEFAULT_REFERENCE_BIAS)
        return cls(mol.norb, mol.nelec, **kw)

    @property
    def norb(self) -> int:
        """Number of spatial orbitals."""
        return self._norb

    @property
    def nelec(self) -> tuple[int, int]:
        """(n_alpha, n_beta)."""
        return self._nelec

    @property
    def n_words(self) -> int:
        """uint64 words per configuration."""
        return self._words

    @property
    def n_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def extra_repr(self) -> str:
        return (
            f"norb={self._norb}, nelec={self._nelec}, d_model={self.d_model}, "
            f"n_layers={self.n_layers}, n_heads={self.n_heads}, "
            f"phase_hidden={self.phase_hidden}, n_parameters={self.n_parameters}"
        )

    # ------------------------------------------------------------------ encoding
    def config_words(self, configs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Configurations as an int64 tensor (n, words) on the module's device, checked.

        Args:
            configs: numpy ``uint64`` (n, words), or a torch ``int64`` tensor holding the same
                bits (``torch.from_numpy(arr.view(np.int64))``); 1-D is accepted when words == 1.

        Example:
            >>> Ansatz(2, (1, 1), seed=0).config_words(np.array([9], dtype=np.uint64))
            tensor([[9]])
        """
        if isinstance(configs, torch.Tensor):
            if configs.dtype != torch.int64:
                raise ValueError(f"config tensors must be int64 (uint64 bits), got {configs.dtype}")
            x = configs.to(self.device)
        else:
            arr = np.asarray(configs)
            if arr.dtype != np.uint64:
                raise ValueError(f"configurations must be a uint64 array, got dtype {arr.dtype}")
            x = torch.from_numpy(np.ascontiguousarray(arr).view(np.int64)).to(self.device)
        if x.ndim == 1 and self._words == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[1] != self._words:
            raise ValueError(
                f"configurations must have shape (n, {self._words}) for norb={self._norb}, "
                f"got {tuple(x.shape)}"
            )
        return x

    def tokens(self, configs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Token sequences ``t_k = n_k,alpha + 2 n_k,beta`` of configurations.

        Args:
            configs: numpy ``uint64`` (n, words), or a torch ``int64`` tensor holding the same
                bits (``torch.from_numpy(arr.view(np.int64))``); 1-D is accepted when words == 1.

        Returns:
            LongTensor (n, norb) on the module's device.

        Example:
            >>> Ansatz(2, (1, 1), seed=0).tokens(np.array([[0b1001]], dtype=np.uint64))
            tensor([[1, 2]])
        """
        x = self.config_words(configs)
        # >> on int64 is arithmetic (sign-extending), so mask with & 1 after the shift.
        bits = (x[:, self._word_index] >> self._bit_shift) & 1
        return bits[:, 0::2] + 2 * bits[:, 1::2]

    def configurations(self, tokens: torch.Tensor) -> np.ndarray:
        """Inverse of `tokens`: uint64 configurations (n, words) as a numpy array."""
        t = tokens.detach().to("cpu", torch.int64)
        bits = torch.stack((t & 1, t >> 1), dim=-1).reshape(len(t), 2 * self._norb)
        return from_bits(bits.numpy().astype(np.uint8))

    # ------------------------------------------------------------------ amplitude
    def _logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Transformer logits (n, L, 4) for input sequences (n, L) starting with the start token."""
        return self._head_logits(self._hidden(inputs))

    def _hidden(self, inputs: torch.Tensor) -> torch.Tensor:
        """The last block's output (n, L, d) for input sequences (n, L)."""
        h = aside.embed(inputs, self.token_embedding.weight, self.position_embedding.weight)
        if self._chained(h):
            return self._chain(h)
        for block in self.blocks:
            h = block(h)
        return h

    def _chained(self, h: torch.Tensor) -> bool:
        """Whether `_hidden` runs the blocks as `_chain` (the residual sums in the LayerNorm
        kernels): `fused_ops.ADD_NORM_ENABLED` with the LayerNorm kernels active on ``h``, and
        the whole-block kernels (`fused_ops.BLOCK_ENABLED`) off."""
        on = fused_ops.ADD_NORM_ENABLED and not fused_ops.BLOCK_ENABLED
        return on and fused_ops.active(h)

    def _chain(self, h: torch.Tensor) -> torch.Tensor:
        """The blocks on the embeddings ``h`` (n, L, d) as `_Block.forward` computes them, each
        residual sum that a LayerNorm reads computed with it (`fused_ops.add_layer_norm`):
        x1 = x + attn(ln1(x)) with ln2(x1), x2 = x1 + mlp(ln2(x1)) with the next block's
        ln1(x2); the last block's sum stays an addition."""
        blocks = self.blocks
        y = blocks[0].ln1(h)
        for i, blk in enumerate(blocks):
            h, y = fused_ops.add_layer_norm(
                h, blk.attn(y), blk.ln2.weight, blk.ln2.bias, blk.ln2.eps
            )
            m = blk.ff(y)
            if i + 1 == len(blocks):
                return h + m
            nxt = blocks[i + 1].ln1
            h, y = fused_ops.add_layer_norm(h, m, nxt.weight, nxt.bias, nxt.eps)
        return h

    def _head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (n, L, 4) from the last block's output ``h``: ln_f, the head, the offsets."""
        return self.head(self.ln_f(h)) + self.logit_bias[: h.shape[1]]

    def _shared_logits(self, inputs: torch.Tensor, tree: PrefixTree) -> torch.Tensor:
        """`_logits` of the input sequences ``inputs`` (n, L) computed once per distinct prefix
        of `tree` (`prefix_tree` of their tokens): the same (n, L, 4) up to rounding."""
        length = inputs.shape[1]
        inputs = inputs.reshape(-1)[tree.first]
        pos = tree.first % length
        h = self.token_embedding(inputs) + self.position_embedding(pos)
        for block in self.blocks:
            h = block.shared(h, tree)
        return (self.head(self.ln_f(h)) + self.logit_bias[pos])[tree.node]

    def _from_tokens(self, tokens: torch.Tensor, what: str, make):
        """``make()``, the parameter-free part ``what`` of a pass over ``tokens``; computed once
        per token tensor inside `reuse_token_work`."""
        cache = getattr(_reuse, "cache", None)
        if cache is None or torch.compiler.is_compiling():
            return make()
        key = (id(self), id(tokens), tokens._version, what)
        if key not in cache:  # the ansatz and the tokens held: their ids stay theirs
            cache[key] = (self, tokens, make())
        return cache[key][2]

    def _token_work(self, tokens: torch.Tensor) -> _TokenWork:
        """The shifted inputs and the masks of the amplitude's pass over ``tokens`` (n, L)."""

        def make() -> _TokenWork:
            start = torch.full((tokens.shape[0], 1), 4, dtype=torch.long, device=tokens.device)
            allowed = self._allowed(tokens, torch.arange(self._norb, device=tokens.device))
            any_allowed = allowed.any(dim=-1, keepdim=True)
            return _TokenWork(
                inputs=torch.cat((start, tokens[:, :-1]), dim=1),
                # Rows with nothing allowed (only behind an out-of-sector prefix) are left
                # unmasked for the softmax, then set to -inf: no NaN values or gradients.
                softmax_fill=~allowed & any_allowed,
                out_fill=~allowed,
            )

        return self._from_tokens(tokens, "amplitude", make)

    def _spins(self, tokens: torch.Tensor) -> torch.Tensor:
        """The phase MLP's input: the +/-1 spin-orbital occupations (n, 2L) of ``tokens``."""

        def make() -> torch.Tensor:
            occ = torch.stack((tokens & 1, tokens >> 1), dim=-1).reshape(len(tokens), -1)
            return (2 * occ - 1).to(self.dtype)

        return self._from_tokens(tokens, "spins", make)

    def _allowed(self, prefix_tokens: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Allowed-token mask (n, L, 4) for the steps ``step`` (L,) after prefix counts of
        ``prefix_tokens`` (n, L): column j holds the tokens before step j."""
        na, nb = self._nelec
        used_a = torch.cumsum(prefix_tokens & 1, dim=1) - (prefix_tokens & 1)
        used_b = torch.cumsum(prefix_tokens >> 1, dim=1) - (prefix_tokens >> 1)
        return allowed_tokens(used_a, used_b, na, nb, self._remaining[step])

    def log_conditionals(
        self, tokens: torch.Tensor, tree: PrefixTree | None = None
    ) -> torch.Tensor:
        """Masked conditional log-probabilities ``log p(t | t_<k)`` for every step and token.

        Args:
            tokens: LongTensor (n, norb), e.g. from `tokens`.
            tree: `prefix_tree(tokens)`: run the transformer once per distinct prefix (the
                same values up to rounding, fewer rows where sequences share prefixes).

        Returns:
            tensor (n, norb, 4); impossible tokens are exactly -inf. Rows after a prefix that
            already left the sector are all -inf.
        """
        work = self._token_work(tokens)
        if tree is not None:
            if tuple(tree.node.shape) != tuple(tokens.shape):
                raise ValueError(
                    f"tree is of tokens {tuple(tree.node.shape)}, not {tuple(tokens.shape)}: "
                    "pass prefix_tree(tokens)"
                )
            logits = self._shared_logits(work.inputs, tree)
        else:
            logits = self._logits(work.inputs)
        return self._masked_log_softmax(logits, work)

    @staticmethod
    def _masked_log_softmax(logits: torch.Tensor, work: _TokenWork) -> torch.Tensor:
        logp = torch.log_softmax(logits.masked_fill(work.softmax_fill, -math.inf), dim=-1)
        return logp.masked_fill(work.out_fill, -math.inf)

    def log_amplitude(self, tokens: torch.Tensor, tree: PrefixTree | None = None) -> torch.Tensor:
        """``ln|psi| = 1/2 sum_k log p(t_k | t_<k)``, normalised over the sector.

        Args:
            tokens: LongTensor (n, norb).
            tree: `prefix_tree(tokens)`: the transformer runs once per distinct prefix
                (`log_conditionals`); gradients flow as without it.

        Returns:
            real tensor (n,); -inf for configurations outside the (N_alpha, N_beta) sector.

        Example:
            >>> from cuscikit.sci.configs import all_determinants
            >>> psi = Ansatz(6, (3, 3), seed=0, dtype=torch.float64)
            >>> tok = psi.tokens(all_determinants(6, (3, 3)))
            >>> a, b = psi.log_amplitude(tok), psi.log_amplitude(tok, tree=prefix_tree(tok))
            >>> bool((a - b).abs().max() < 1e-13), len(prefix_tree(tok).first) < tok.numel()
            (True, True)
        """
        if tree is None:
            fused = fused_ops.amplitude(self, tokens)  # when switched on: one kernel each way
            if fused is not None:
                return fused
            work = self._token_work(tokens)
            h = self._hidden(work.inputs)
            # a training pass on a GPU: ln_f, the head and what follows as one kernel each way
            amp = fused_ops.amplitude_tail(self, h, tokens)
            if amp is not None:
                return amp
            logp = self._masked_log_softmax(self._head_logits(h), work)
        else:
            logp = self.log_conditionals(tokens, tree)
        logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return 0.5 * logp.sum(dim=1)

    def phase(self, tokens: torch.Tensor) -> torch.Tensor:
        """Phase ``phi`` (n,) from the MLP on the +/-1 spin-orbital occupation vector."""
        layers = list(self.phase_net)
        linear, gelus = layers[::2], layers[1::2]
        if all(isinstance(m, nn.GELU) and m.approximate == "none" for m in gelus) and all(
            isinstance(m, nn.Linear) for m in linear
        ):  # the layers with a GELU between each two (`_build`), as one MLP (`aside.mlp`)
            return aside.mlp(self._spins(tokens), linear).squeeze(-1)
        return self.phase_net(self._spins(tokens)).squeeze(-1)

    def log_psi(
        self, configs: np.ndarray | torch.Tensor, batch_size: int | None = None
    ) -> torch.Tensor:
        """``ln psi(x) = ln|psi(x)| + i phi(x)`` of given configurations (one forward pass each).

        Args:
            configs: uint64 array (n, words) or int64 tensor, as in `tokens`.
            batch_size: evaluate in chunks of this many configurations (autograd is kept when
                grad is enabled); ``None`` evaluates all at once.

        Returns:
            complex tensor (n,) on the module's device: complex64 for float32 parameters,
            complex128 for float64.

        Example:
            >>> psi = Ansatz(4, 4, seed=0)
            >>> psi.log_psi(psi.sample(10)[0]).shape[0] > 0
            True
        """
        if batch_size is not None:
            batch_size = _check_positive_int("batch_size", batch_size)
        n = len(configs)
        if batch_size is None or n <= batch_size:
            return self._log_psi_tokens(self.tokens(configs))
        parts = [
            self._log_psi_tokens(self.tokens(configs[i : i + batch_size]))
            for i in range(0, n, batch_size)
        ]
        return torch.cat(parts)

    def _log_psi_tokens(self, tokens: torch.Tensor, tree: PrefixTree | None = None) -> torch.Tensor:
        return torch.complex(*self._log_psi_parts(tokens, tree))

    def _log_psi_parts(
        self, tokens: torch.Tensor, tree: PrefixTree | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ln|psi|, phi)`` of token rows, both in ln|psi|'s dtype (one dtype under
        autocast): a loss of the two real parts takes its gradient without complex tensors."""
        side = aside.branch_stream(tokens)  # in the recorded stage with aside.PHASE: a stream
        with aside.branch(side, tokens):  # the phase MLP beside the transformer, both ways
            phase = self.phase(tokens)
        amp = self.log_amplitude(tokens, tree)
        aside.merge(side, phase)
        return amp, phase.to(amp.dtype)

    def forward(
        self, configs: np.ndarray | torch.Tensor, batch_size: int | None = None
    ) -> torch.Tensor:
        """Same as `log_psi`."""
        return self.log_psi(configs, batch_size=batch_size)

    # ------------------------------------------------------------------ sampling
    def _step_logits(
        self, last: torch.Tensor, k: int, caches: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Logits (m, 4) of step ``k`` given the input token ``last`` (m,) of that step (the
        start token at k = 0) and the key/value caches of steps < k; returns the new caches."""
        pos = self.position_embedding.weight[k]
        h = (self.token_embedding(last) + pos).unsqueeze(1)
        new = []
        for i, block in enumerate(self.blocks):
            h, c = block.step(h, None if caches is None else caches[i])
            new.append(c)
        return self.head(self.ln_f(h))[:, 0] + self.logit_bias[k], new

    @torch.no_grad()
    def sample(
        self,
        n_samples: int,
        *,
        generator: torch.Generator | int | None = None,
        max_batch: int = 16384,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n_samples`` configurations from |psi|^2 by batched autoregressive tree search.

        Unique prefixes are kept with their counts; each step runs one batched forward (with a
        key/value cache, so one new position per prefix) over all prefixes and splits every
        prefix's count among its four children with a multinomial draw on the masked
        conditional probabilities (as a chain of binomials). Children with count zero are
        dropped, so the work grows with the number of unique samples, not with ``n_samples``.
        When more than ``max_batch`` prefixes are alive, they are finished in chunks of
        ``max_batch`` (depth first), which bounds the cache memory.

        Args:
            n_samples: total number of samples (counts sum to it; exact up to 2**53).
            generator: a torch.Generator on the module's device, or an int seed for one;
                ``None`` uses torch's global RNG. The draws depend on ``max_batch`` too.
            max_batch: most prefixes in one forward pass.

        Returns:
            (configs, counts): unique uint64 configurations (u, words) and int64 counts (u,).

        Example:
            >>> psi = Ansatz(4, (2, 1), seed=0)
            >>> x, c = psi.sample(500, generator=7)
            >>> int(c.sum()), x.shape[1]
            (500, 1)
        """
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)):
            raise ValueError(f"n_samples must be a non-negative integer, got {n_samples!r}")
        if n_samples < 0:
            raise ValueError(f"n_samples must be non-negative, got {n_samples}")
        max_batch = _check_positive_int("max_batch", max_batch)
        if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
            generator = torch.Generator(device=self.device).manual_seed(int(generator))
        if n_samples == 0:
            return np.zeros((0, self._words), np.uint64), np.zeros(0, np.int64)
        dev = self.device
        prefixes = torch.zeros((1, 0), dtype=torch.long, device=dev)
        counts = torch.tensor([float(n_samples)], dtype=torch.float64, device=dev)
        done = self._grow(prefixes, counts, None, generator, max_batch)
        tokens = torch.cat([t for t, _ in done])
        counts = torch.cat([c for _, c in done])
        return self.configurations(tokens), counts.to("cpu").numpy().astype(np.int64)

    def _grow(
        self,
        prefixes: torch.Tensor,
        counts: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]] | None,
        generator: torch.Generator | None,
        max_batch: int,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Extend ``prefixes`` (m, k) with ``counts`` (m,) to full length; returns the finished
        (tokens, counts) pieces."""
        na, nb = self._nelec
        while (k := prefixes.shape[1]) < self._norb:
            m = len(prefixes)
            if m > max_batch:
                out = []
                for i in range(0, m, max_batch):
                    sl = slice(i, i + max_batch)
                    sub = None if caches is None else [(a[sl], b[sl]) for a, b in caches]
                    out += self._grow(prefixes[sl], counts[sl], sub, generator, max_batch)
                return out
            last = prefixes[:, -1] if k else torch.full((m,), 4, device=prefixes.device)
            logits, caches = self._step_logits(last, k, caches)
            used_a = (prefixes & 1).sum(dim=1)
            used_b = (prefixes >> 1).sum(dim=1)
            allowed = allowed_tokens(used_a, used_b, na, nb, self._remaining[k])
            probs = torch.softmax(logits.to(torch.float64).masked_fill(~allowed, -math.inf), -1)
            child = self._split_counts(counts, probs, generator)
            parent, token = torch.nonzero(child, as_tuple=True)
            prefixes = torch.cat((prefixes[parent], token[:, None]), dim=1)
            counts = child[parent, token]
            caches = [(a[parent], b[parent]) for a, b in caches]
        return [(prefixes, counts)]

    @staticmethod
    def _split_counts(
        counts: torch.Tensor, probs: torch.Tensor, generator: torch.Generator | None
    ) -> torch.Tensor:
        """Multinomial split of ``counts`` (m,) over 4 children with ``probs`` (m, 4), as the
        binomial chain n_j ~ Bin(rest, p_j / sum_{i>=j} p_i). Suffix sums make the ratio exactly
        1 for the last child with p > 0, so children with p = 0 always get nothing."""
        suffix = torch.flip(torch.cumsum(torch.flip(probs, [1]), dim=1), [1])
        ratio = torch.where(suffix > 0, probs / suffix.clamp_min(1e-300), 0.0).clamp(0.0, 1.0)
        rest = counts.clone()
        out = torch.zeros_like(probs)
        for j in range(4):
            n_j = torch.binomial(rest, ratio[:, j].contiguous(), generator=generator)
            out[:, j] = n_j
            rest = rest - n_j
        return out
