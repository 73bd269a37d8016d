"""Torch networks with the compute shape of CosyVoice2's stages, random weights (GPU stand-ins).

Imported by the Python-backend models of ``bench/gpu/standins/<model>/model.py`` (the
sweep puts this directory on the stub's ``PYTHONPATH``). Nothing here is CosyVoice's code or
weights; only the geometry is CosyVoice2's:

- :class:`Decoder`: the LLM stage, a Qwen2-0.5B-shaped decoder (24 layers, hidden 896,
  FFN 4864, 14 query heads and 2 KV heads of 64, RoPE, RMSNorm, SwiGLU; the text embedding of
  Qwen2's 151936 tokens, and CosyVoice2's speech embedding and speech-token head of 6564),
  bfloat16 on a GPU. Decoding is one token per step for every occupied slot of a static KV
  cache, the step captured once per batch bucket in a CUDA graph (a TensorRT-LLM engine
  runs its decode steps as graphs; eager PyTorch on the lent H200 is bound by kernel
  launches, ``../shared/docs/gpu.md``), the prompt run eagerly when a request is admitted
  (in-flight batching: requests join and leave between steps).
- :class:`Token2Wav`: the flow-matching decoder (an estimator of transformer blocks run for
  10 Euler steps with classifier-free guidance, i.e. twice the batch, over the mel frames of
  the prompt and of every token so far, 2 frames per token, as upstream's CosyVoice2
  ``token2wav`` recomputes the whole sequence for each chunk) followed by a HiFT-shaped
  vocoder (transposed convolutions from 50 mel frames per second to 24 kHz) over the new
  frames only. Run eagerly: chunk lengths vary.

``COSYVOICE_STANDIN_SIZE=tiny`` shrinks both (2 layers, narrow) so the CPU twin in CI can
load and run the same code without a GPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ORIGINAL_VOCAB_SIZE = 151663  # CosyVoice2: speech token i is ORIGINAL_VOCAB_SIZE + i
SPEECH_VOCAB = 6564  # 6561 speech tokens and 3 special ones
TEXT_VOCAB = 151936
MEL_BINS = 80
MEL_FRAMES_PER_TOKEN = 2
SAMPLES_PER_FRAME = 480  # 24 kHz / 50 frames per second
FRAME_BUCKET = 128  # token2wav's graphs: frames padded up to a multiple of this
MAX_FRAMES = 1664  # prompt and 750 speech tokens, 2 frames each, rounded up to the bucket


@dataclass(frozen=True)
class LlmGeometry:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class FlowGeometry:
    blocks: int
    dim: int
    heads: int
    ffn: int
    steps: int
    vocoder_channels: tuple[int, ...]
    upsample: tuple[int, ...]


QWEN2_05B = LlmGeometry(layers=24, hidden=896, ffn=4864, heads=14, kv_heads=2, head_dim=64)
TINY_LLM = LlmGeometry(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16)
# CosyVoice2's ConditionalDecoder has 256 channels, 8 heads of 64 and 14 down/mid/up stages of
# 4 transformer blocks each; 16 blocks of the same width stand in for it (10 solver steps).
FLOW = FlowGeometry(
    blocks=16,
    dim=256,
    heads=8,
    ffn=1024,
    steps=10,
    vocoder_channels=(512, 256, 128, 64),
    upsample=(8, 5, 3, 4),
)
TINY_FLOW = FlowGeometry(
    blocks=1,
    dim=32,
    heads=2,
    ffn=64,
    steps=2,
    vocoder_channels=(16, 8, 8, 8),
    upsample=(8, 5, 3, 4),
)


def tiny() -> bool:
    return os.environ.get("COSYVOICE_STANDIN_SIZE", "full") == "tiny"


def device_of(args: dict[str, str]) -> torch.device:
    """The instance's device: Triton's KIND_GPU instances carry their GPU index."""
    if args.get("model_instance_kind") == "GPU":
        return torch.device(f"cuda:{int(args['model_instance_device_id'])}")
    return torch.device("cpu")


def dtype_for(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class _Weights:
    """Random weights, scaled so activations stay finite through many layers."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(self, *shape: int, scale: float | None = None) -> torch.Tensor:
        std = scale if scale is not None else 1.0 / math.sqrt(shape[0])
        out = torch.randn(*shape, generator=self.generator, device=self.device)
        return (out * std).to(self.dtype)

    def ones(self, *shape: int) -> torch.Tensor:
        return torch.ones(*shape, device=self.device, dtype=self.dtype)


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding; x [..., D], cos/sin broadcastable to [..., D/2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, H, Tq, D], k/v [B, H, Tk, D], mask [B or 1, 1, Tq, Tk] True where allowed."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


class Decoder:
    """The LLM stage: a static KV cache of ``slots`` sequences of ``max_len`` tokens."""

    def __init__(self, device: torch.device, slots: int, max_len: int) -> None:
        g = TINY_LLM if tiny() else QWEN2_05B
        self.g, self.device, self.slots, self.max_len = g, device, slots, max_len
        self.dtype = dtype_for(device)
        w = _Weights(device, self.dtype, seed=1)
        q_dim, kv_dim = g.heads * g.head_dim, g.kv_heads * g.head_dim
        self.text_embedding = w(TEXT_VOCAB, g.hidden, scale=0.02)
        self.speech_embedding = w(SPEECH_VOCAB, g.hidden, scale=0.02)
        self.layers = [
            {
                "norm1": w.ones(g.hidden),
                "qkv": w(g.hidden, q_dim + 2 * kv_dim),
                "out": w(q_dim, g.hidden),
                "norm2": w.ones(g.hidden),
                "gate_up": w(g.hidden, 2 * g.ffn),
                "down": w(g.ffn, g.hidden),
            }
            for _ in range(g.layers)
        ]
        self.norm = w.ones(g.hidden)
        self.head = w(g.hidden, SPEECH_VOCAB)
        shape = (g.layers, slots, g.kv_heads, max_len, g.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=self.dtype)
        self.values = torch.zeros(shape, device=device, dtype=self.dtype)
        inv = 1.0 / (10000 ** (torch.arange(0, g.head_dim, 2, device=device).float() / g.head_dim))
        angles = torch.arange(max_len, device=device).float()[:, None] * inv[None, :]
        self.cos, self.sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        self.positions = torch.arange(max_len, device=device)
        # The decode step's static inputs and output (graph-captured per batch bucket).
        self.token = torch.zeros(slots, dtype=torch.long, device=device)
        self.position = torch.zeros(slots, dtype=torch.long, device=device)
        self.next_token = torch.zeros(slots, dtype=torch.long, device=device)
        self.graphs: dict[int, Any] = {}

    def _layer(self, x: torch.Tensor, layer: dict[str, torch.Tensor], idx: int, attend: Any) -> Any:
        g = self.g
        h = _rms(x, layer["norm1"]) @ layer["qkv"]
        q_dim, kv_dim = g.heads * g.head_dim, g.kv_heads * g.head_dim
        q, k, v = h.split((q_dim, kv_dim, kv_dim), dim=-1)
        x = x + attend(q, k, v, idx) @ layer["out"]
        gate, up = (_rms(x, layer["norm2"]) @ layer["gate_up"]).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ layer["down"]

    def prefill(self, slot: int, ids: list[int]) -> int:
        """Run a prompt (text ids, then speech ids >= ORIGINAL_VOCAB_SIZE) into ``slot``'s cache;
        returns the first generated speech token and leaves the step inputs set for it."""
        g, n = self.g, len(ids)
        if n >= self.max_len:
            raise ValueError(f"prompt of {n} tokens does not fit the cache ({self.max_len})")
        t = torch.tensor(ids, device=self.device)
        speech = t >= ORIGINAL_VOCAB_SIZE
        x = torch.where(
            speech[:, None],
            self.speech_embedding[(t - ORIGINAL_VOCAB_SIZE).clamp(0, SPEECH_VOCAB - 1)],
            self.text_embedding[t.clamp(0, TEXT_VOCAB - 1)],
        )[None]
        cos, sin = self.cos[:n], self.sin[:n]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None, None]

        def attend(q: Any, k: Any, v: Any, idx: int) -> Any:
            q = _rope(q.view(1, n, g.heads, g.head_dim).transpose(1, 2), cos, sin)
            k = _rope(k.view(1, n, g.kv_heads, g.head_dim).transpose(1, 2), cos, sin)
            v = v.view(1, n, g.kv_heads, g.head_dim).transpose(1, 2)
            self.keys[idx, slot, :, :n] = k[0]
            self.values[idx, slot, :, :n] = v[0]
            rep = g.heads // g.kv_heads
            out = _attend(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), causal)
            return out.transpose(1, 2).reshape(1, n, g.heads * g.head_dim)

        for idx, layer in enumerate(self.layers):
            x = self._layer(x, layer, idx, attend)
        first = int((_rms(x[:, -1], self.norm) @ self.head).argmax(-1).item())
        self.token[slot] = first
        self.position[slot] = n
        return first

    def _step(self, batch: int) -> None:
        """One decode step for slots [0, batch): reads token/position, writes next_token and
        advances both (positions clamped inside the cache, so free slots stay harmless)."""
        g = self.g
        pos = self.position[:batch]
        x = self.speech_embedding[self.token[:batch]]
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        rows = torch.arange(batch, device=self.device)
        allowed = (self.positions[None, :] <= pos[:, None])[:, None, None, :]
        rep = g.heads // g.kv_heads

        def attend(q: Any, k: Any, v: Any, idx: int) -> Any:
            q = _rope(q.view(batch, g.heads, g.head_dim), cos, sin)
            k = _rope(k.view(batch, g.kv_heads, g.head_dim), cos, sin)
            self.keys[idx, rows, :, pos] = k
            self.values[idx, rows, :, pos] = v.view(batch, g.kv_heads, g.head_dim)
            keys = self.keys[idx, :batch].repeat_interleave(rep, 1)
            values = self.values[idx, :batch].repeat_interleave(rep, 1)
            out = _attend(q[:, :, None, :], keys, values, allowed)
            return out.reshape(batch, g.heads * g.head_dim)

        for idx, layer in enumerate(self.layers):
            x = self._layer(x, layer, idx, attend)
        nxt = (_rms(x, self.norm) @ self.head).argmax(-1)
        self.next_token[:batch].copy_(nxt)
        self.token[:batch].copy_(nxt)
        self.position[:batch].add_(1).clamp_(max=self.max_len - 1)

    def buckets(self) -> list[int]:
        sizes, b = [], 1
        while b < self.slots:
            sizes.append(b)
            b *= 2
        return [*sizes, self.slots]

    def capture(self) -> None:
        """One CUDA graph per batch bucket, each replayed once right away (a bad bucket fails
        at load time, not under load). Without CUDA the step runs eagerly."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(2):
                self._step(self.slots)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for batch in self.buckets():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                self._step(batch)
            graph.replay()
            self.graphs[batch] = graph
        torch.cuda.synchronize(self.device)
        self.position.zero_()
        self.token.zero_()

    def step(self, occupied: int) -> list[int]:
        """A decode step over the smallest bucket holding slots [0, occupied)."""
        batch = next(b for b in self.buckets() if b >= occupied)
        with torch.no_grad():
            if batch in self.graphs:
                self.graphs[batch].replay()
            else:
                self._step(batch)
        return [int(t) for t in self.next_token[:occupied].tolist()]


class Token2Wav:
    """Flow-matching decoder and vocoder; ``run`` takes a batch of chunks."""

    def __init__(self, device: torch.device) -> None:
        g = TINY_FLOW if tiny() else FLOW
        self.g, self.device, self.dtype = g, device, dtype_for(device)
        w = _Weights(device, self.dtype, seed=2)
        self.token_embedding = w(SPEECH_VOCAB, g.dim, scale=0.02)
        self.mel_in = w(MEL_BINS, g.dim)
        self.time = w(1, g.dim, scale=1.0)
        self.blocks = [
            {
                "norm1": w.ones(g.dim),
                "qkv": w(g.dim, 3 * g.dim),
                "out": w(g.dim, g.dim),
                "norm2": w.ones(g.dim),
                "ff1": w(g.dim, g.ffn),
                "ff2": w(g.ffn, g.dim),
            }
            for _ in range(g.blocks)
        ]
        self.mel_out = w(g.dim, MEL_BINS)
        channels = (MEL_BINS, *g.vocoder_channels)
        self.vocoder = [
            (w(channels[i], channels[i + 1], rate * 2), rate) for i, rate in enumerate(g.upsample)
        ]
        self.vocoder_out = w(channels[-1], 1, 7)
        self.graphs: dict[tuple[int, int], Any] = {}
        self.batch_buckets: list[int] = []

    def _estimate(self, x: torch.Tensor, cond: torch.Tensor, t: float, mask: Any) -> Any:
        g = self.g
        h = (x @ self.mel_in) + cond + t * self.time
        b, n, _ = h.shape
        for blk in self.blocks:
            q, k, v = (_rms(h, blk["norm1"]) @ blk["qkv"]).chunk(3, dim=-1)
            q, k, v = (z.view(b, n, g.heads, -1).transpose(1, 2) for z in (q, k, v))
            h = h + _attend(q, k, v, mask).transpose(1, 2).reshape(b, n, g.dim) @ blk["out"]
            h = h + F.gelu(_rms(h, blk["norm2"]) @ blk["ff1"]) @ blk["ff2"]
        return h @ self.mel_out

    def _vocode(self, mel: torch.Tensor) -> torch.Tensor:
        x = mel.transpose(1, 2)  # [B, 80, F]
        for weight, rate in self.vocoder:
            x = F.leaky_relu(x, 0.1)
            x = F.conv_transpose1d(x, weight, stride=rate, padding=rate // 2)
        x = F.conv1d(torch.tanh(x), self.vocoder_out.transpose(0, 1).contiguous(), padding=3)
        return x[:, 0]

    def _flow(self, x: torch.Tensor, cond2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The solver: ``steps`` Euler steps of the estimator with classifier-free guidance."""
        g = self.g
        for step in range(g.steps):
            v = self._estimate(torch.cat([x, x]), cond2, step / g.steps, mask)
            guided, free = v.chunk(2)
            x = x + (1.7 * guided - 0.7 * free) / g.steps
        return x

    def capture(self, max_batch: int) -> None:
        """One CUDA graph of the whole solver per (batch, frames) bucket, like a TensorRT
        plan with dynamic shapes runs fused; each replayed once right away. Chunks are padded
        up to their bucket. Without CUDA the solver runs eagerly."""
        if self.device.type != "cuda":
            return
        self.batch_buckets = [b for b in (1, 2, 4, 8, 16, 32, 64) if b < max_batch] + [max_batch]
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for batch in self.batch_buckets:
            for frames in range(FRAME_BUCKET, MAX_FRAMES + 1, FRAME_BUCKET):
                x = torch.randn(batch, frames, MEL_BINS, device=self.device).to(self.dtype)
                cond2 = torch.zeros(
                    2 * batch, frames, self.g.dim, device=self.device, dtype=self.dtype
                )
                mask = torch.ones(2 * batch, 1, 1, frames, dtype=torch.bool, device=self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream), torch.no_grad():
                    self._flow(x, cond2, mask)  # warm-up before capture
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool), torch.no_grad():
                    out = self._flow(x, cond2, mask)
                graph.replay()
                self.graphs[(batch, frames)] = (graph, x, cond2, mask, out)
        torch.cuda.synchronize(self.device)

    def run(self, chunks: list[tuple[list[int], int, int]]) -> list[torch.Tensor]:
        """chunks: (prompt + target tokens (speech ids, 0-based), first new token, new tokens).
        Returns each chunk's audio, float32 [1, new tokens x 960], on the instance's device."""
        n = max(len(tokens) for tokens, _, _ in chunks)
        frames = n * MEL_FRAMES_PER_TOKEN
        if frames > MAX_FRAMES:
            raise ValueError(f"{n} tokens exceed the stand-in's {MAX_FRAMES // 2}")
        bucket = None
        if self.graphs:
            batch = next(b for b in self.batch_buckets if b >= len(chunks))
            frames = -(-frames // FRAME_BUCKET) * FRAME_BUCKET
            bucket = self.graphs[(batch, frames)]
        rows = bucket[1].shape[0] if bucket else len(chunks)
        ids = torch.zeros(
            rows, frames // MEL_FRAMES_PER_TOKEN, dtype=torch.long, device=self.device
        )
        lengths = torch.zeros(rows, dtype=torch.long, device=self.device)
        for row, (tokens, _, _) in enumerate(chunks):
            ids[row, : len(tokens)] = torch.tensor(tokens, device=self.device)
            lengths[row] = len(tokens)
        with torch.no_grad():
            cond = self.token_embedding[ids.clamp(0, SPEECH_VOCAB - 1)]
            cond = cond.repeat_interleave(MEL_FRAMES_PER_TOKEN, dim=1)
            valid = torch.arange(frames, device=self.device)[None, :] < (
                lengths[:, None] * MEL_FRAMES_PER_TOKEN
            )
            mask = valid[:, None, None, :].repeat(2, 1, 1, 1)
            mask[:, :, :, 0] = True  # padding rows attend to something
            cond2 = torch.cat([cond, torch.zeros_like(cond)])  # classifier-free guidance
            noise = torch.randn(rows, frames, MEL_BINS, device=self.device).to(self.dtype)
            if bucket:
                graph, x_in, cond_in, mask_in, x = bucket
                x_in.copy_(noise)
                cond_in.copy_(cond2)
                mask_in.copy_(mask)
                graph.replay()
            else:
                x = self._flow(noise, cond2, mask)
            out = []
            for row, (_, first, count) in enumerate(chunks):
                mel = x[row : row + 1, first * 2 : (first + count) * 2]
                audio = self._vocode(mel)[:, : count * MEL_FRAMES_PER_TOKEN * SAMPLES_PER_FRAME]
                out.append(audio.float().contiguous())
        return out


class Encoder:
    """The reference-audio models' shape (audio tokenizer, speaker embedding): strided
    convolutions over 16 kHz audio (25 tokens or one pooled vector per clip)."""

    def __init__(self, device: torch.device, out_dim: int) -> None:
        self.device, self.dtype = device, dtype_for(device)
        w = _Weights(device, self.dtype, seed=3)
        width = 32 if tiny() else 512
        self.convs = [(w(width, 1, 10), 5), (w(width, width, 8), 4), (w(width, width, 32), 32)]
        self.out = w(width, out_dim)

    def features(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [1, N] float32 at 16 kHz -> [T, out_dim], T = N / 640 (25 per second)."""
        x = wav.to(self.device, self.dtype)[:, None, :]
        with torch.no_grad():
            for weight, stride in self.convs:
                x = F.gelu(F.conv1d(x, weight, stride=stride))
            return x[0].transpose(0, 1) @ self.out
