"""An FP8 KV pool: chapter 2's pool with every K and V element in one byte (`float8_e4m3fn`) and a scale. An engine
takes it through chapter 2's pool seam, `Engine(..., pool=kv_pool("fp8_e4m3"))`, or `make_engine(kv_cache_dtype=...)`.

e4m3 is a float of 1 sign bit, 4 exponent bits (bias 7) and 3 mantissa bits; the "fn" variant keeps no
infinities and one NaN pattern, so its largest value is 448 = 1.75 * 2^8. Normal values run from 2^-6 to 448 and
each is rounded to within 1/16 of itself (half a step of 1/8); below 2^-6 the subnormals keep a fixed step of
2^-9. A scale maps a tensor's range onto the format's: stored = fp8(x / s) (saturated at +-448), read = stored * s.

Where the scales come from is the design choice (the lesson measures it on the real model):
- **dynamic, per token and head** (`scales=None`): each head row of each new token gets s = amax(|row|) / 448 when
  it is stored, and the scale is kept beside the row in the pool (`k_scale`, `v_scale`, fp32: 4 bytes per 64
  or 128 one-byte elements, counted in `bytes_per_block`). No data needed in advance; a block carries its scales;
- **static, per layer or per layer and head** (`scales=KVScales`): vLLM's and SGLang's k_scale / v_scale, fixed
  for the pool's life, computed by `calibrate` from the fp32 model's K/V over a calibration text (amax / 448);
  the pool stores only the bytes.
Both `store` (quantize) and `gather` (dequantize to the compute dtype) keep chapter 2's interface, so
`PagedAttention` runs unchanged over this pool.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from step01_kvcache.config import ModelConfig
from step01_kvcache.kv_cache import KVCache
from step01_kvcache.model import Transformer
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_pool import KVPool

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")  # "auto": the model's dtype (vLLM's and SGLang's name for it)


def token_scales(x: torch.Tensor) -> torch.Tensor:
    """The dynamic scale of every row: x [..., D] -> [...] fp32, amax(|row|) / 448 (1 for a row of zeros)."""
    amax = x.abs().amax(-1).float()
    # divided by a tensor: on a GPU, PyTorch divides by a Python number as a multiplication by its reciprocal,
    # which is 1 ulp off the true quotient now and then (the store kernel divides exactly, as div_rn)
    return torch.where(amax > 0, amax / amax.new_tensor(FP8_MAX), 1.0)


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., D] / scale [...] (one scale per row, broadcast over D), saturated at +-448, rounded to e4m3
    (to nearest, ties to even). Division in fp32, as the store kernel divides."""
    return (x.float() / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The stored rows [..., D] times their scales [...], in `dtype`."""
    return (x.float() * scale[..., None]).to(dtype)


@dataclass(frozen=True)
class KVScales:
    """Static scales: `k[layer]`, `v[layer]` hold one scale per KV head (per layer and head) or a single one (per
    layer: vLLM's k_scale / v_scale). Plain floats, so that a config holding them is hashable and they go to JSON."""

    k: tuple[tuple[float, ...], ...]
    v: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        rows = list(self.k + self.v)
        if not rows or len(self.k) != len(self.v) or any(
                not isinstance(row, tuple) or len(row) != len(self.k[0]) or not row for row in rows):
            raise ValueError("KVScales: k and v need one equally long tuple of scales per layer")
        if not all(isinstance(x, float) and math.isfinite(x) and x > 0 for row in rows for x in row):
            raise ValueError("KVScales: every scale must be a finite positive float")

    @property
    def granularity(self) -> str:
        return "tensor" if all(len(row) == 1 for row in self.k + self.v) else "head"

    def tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """[num_layers, heads or 1] fp32 each."""
        return (torch.tensor(self.k, dtype=torch.float32, device=device),
                torch.tensor(self.v, dtype=torch.float32, device=device))

    def per_layer(self) -> KVScales:
        """One scale per layer: the largest of its heads' (vLLM's k_scale / v_scale from per-head calibration)."""
        return KVScales(tuple((max(row),) for row in self.k), tuple((max(row),) for row in self.v))

    @classmethod
    def uniform(cls, num_layers: int, value: float = 1.0) -> KVScales:
        """One scale for everything: 1.0 is what vLLM uses when a checkpoint brings no calibrated scales."""
        return cls(((value,),) * num_layers, ((value,),) * num_layers)


@torch.inference_mode()
def calibrate(model: Transformer, prompts: Sequence[Sequence[int]]) -> KVScales:
    """Static scales per layer and head from data: run the model (in its own dtype) over each prompt with chapter 1's
    contiguous cache, take the largest |K| and |V| each layer and head stored, and map it to 448 (`per_layer()` keeps
    the largest of a layer's heads). A value beyond the calibration's range saturates at +-448 later: the
    calibration text decides the scales, so it is named wherever they are used."""
    cfg = model.config
    amax_k = torch.zeros(cfg.num_layers, cfg.num_kv_heads)
    amax_v = torch.zeros_like(amax_k)
    for ids in prompts:
        cache = KVCache(cfg, len(ids), model.dtype, model.device)
        model(torch.tensor(list(ids), device=model.device), torch.arange(len(ids), device=model.device), cache)
        amax_k = torch.maximum(amax_k, cache.k.abs().amax(dim=(1, 3)).float().cpu())  # [layers, heads]
        amax_v = torch.maximum(amax_v, cache.v.abs().amax(dim=(1, 3)).float().cpu())
    to_scales = lambda a: tuple(tuple(float(x) / FP8_MAX for x in row) for row in a.clamp(min=1e-30))  # noqa: E731
    return KVScales(to_scales(amax_k), to_scales(amax_v))


class FP8KVPool(KVPool):
    """Chapter 2's pool with K and V stored as float8_e4m3fn; `gather` returns them in the compute `dtype`.

    `scales=None`: dynamic scales per token and head, `k_scale` / `v_scale` [num_layers, num_blocks, block_size,
    num_kv_heads] fp32 beside the bytes. A `KVScales`: static scales, `k_scale` / `v_scale` [num_layers, heads or 1],
    the same for every slot."""

    def __init__(self, cfg: ModelConfig, geometry: PoolGeometry, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", scales: KVScales | None = None) -> None:
        super().__init__(cfg, geometry, FP8, device)
        self.dtype = dtype  # what gather returns: the model's dtype
        self.dynamic = scales is None
        if self.dynamic:
            shape = (cfg.num_layers, geometry.num_blocks, geometry.block_size, cfg.num_kv_heads)
            self.k_scale = torch.ones(shape, dtype=torch.float32, device=device)
            self.v_scale = torch.ones(shape, dtype=torch.float32, device=device)
        else:
            k, v = scales.tensors(device)
            if k.shape[0] != cfg.num_layers or k.shape[1] not in (1, cfg.num_kv_heads):
                raise ValueError(f"kv_scales hold [{k.shape[0]}, {k.shape[1]}] scales; the model needs "
                                 f"[{cfg.num_layers}, 1 or {cfg.num_kv_heads}] (layers, one per KV head or per layer)")
            self.k_scale, self.v_scale = k, v
        self.granularity = "token" if self.dynamic else scales.granularity

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's scales for the kernels: per token and head ([num_blocks, block_size, heads]), or static
        ([heads or 1])."""
        return self.k_scale[layer], self.v_scale[layer]

    def per_slot_tensors(self) -> tuple[torch.Tensor, ...]:
        """The dynamic scales: a block moves with them, or it is read back with another block's scales."""
        return (self.k_scale, self.v_scale) if self.dynamic else ()

    @property
    def bytes_per_block(self) -> int:
        """K and V bytes of one block, all layers, with the dynamic scales stored beside them (static scales are
        a few numbers per layer, not per block)."""
        scales = 2 * self.k_scale[:, 0].nbytes if self.dynamic else 0
        return super().bytes_per_block + scales

    def _scales(self, scale: torch.Tensor, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """The scales of the rows at `slots` (any shape): [*slots.shape, heads] or, static, [heads or 1]."""
        if self.dynamic:
            return scale[layer].view(-1, scale.shape[-1])[slots]
        return scale[layer]

    def store(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize this step's rows [T, heads, dim] (dynamic: each row with its own new scale) and store them."""
        if self.dynamic:
            k_s, v_s = token_scales(k), token_scales(v)
            self.k_scale[layer].view(-1, k_s.shape[-1])[slot_mapping] = k_s
            self.v_scale[layer].view(-1, v_s.shape[-1])[slot_mapping] = v_s
        else:
            k_s, v_s = self.k_scale[layer], self.v_scale[layer]
        super().store(layer, slot_mapping, quantize(k, k_s), quantize(v, v_s))

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at `slots`, dequantized to the compute dtype."""
        k, v = super().gather(layer, slots)
        return (dequantize(k, self._scales(self.k_scale, layer, slots), self.dtype),
                dequantize(v, self._scales(self.v_scale, layer, slots), self.dtype))


def kv_pool(kv_cache_dtype: str = "auto", kv_scales: KVScales | None = None) -> Callable[..., KVPool]:
    """The pool an engine builds (chapter 2's `pool` seam: `(model config, geometry, dtype, device) -> KVPool`):
    "auto" keeps K/V in the model's dtype (chapter 2's KVPool, unchanged), "fp8_e4m3" one byte per element with
    `kv_scales` (static) or, without them, dynamic scales per token and head (vLLM's and SGLang's names)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    if kv_scales is not None and (kv_cache_dtype == "auto" or not isinstance(kv_scales, KVScales)):
        raise ValueError("kv_scales must be a KVScales, for kv_cache_dtype='fp8_e4m3' only; got "
                         f"{type(kv_scales).__name__} with {kv_cache_dtype!r}")
    if kv_cache_dtype == "auto":
        return KVPool
    return functools.partial(FP8KVPool, scales=kv_scales)


def make_kv_pool(cfg: ModelConfig, geometry: PoolGeometry, kv_cache_dtype: str = "auto",
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 kv_scales: KVScales | None = None) -> KVPool:
    """A pool of `kv_cache_dtype` outside an engine (to count its bytes, say)."""
    return kv_pool(kv_cache_dtype, kv_scales)(cfg, geometry, dtype, device)
