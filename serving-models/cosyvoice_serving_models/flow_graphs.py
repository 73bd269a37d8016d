"""The flow's estimator as CUDA graphs: upstream's ``CausalConditionalDecoder`` modules, our
forward, one graph per padded length.

Why: on a GPU, upstream's flow run eagerly is bound by kernel launches (584 ms per 1-s
streaming chunk on an H200, ``../shared/docs/gpu.md``): 10 Euler steps, each a pass of the
estimator's 16 resnet + 64 transformer blocks. Upstream runs the estimator as a TensorRT
plan instead; this module is the torch equivalent, a CUDA graph per shape. Upstream's own
``forward`` cannot be captured: it builds its attention mask inside, and
``cosyvoice.utils.mask.add_optional_chunk_mask`` reads a tensor on the host (``.item()``),
which invalidates a capture.

So :func:`estimate` walks the estimator's own submodules (``time_embeddings``, ``time_mlp``,
``down_blocks``, ``mid_blocks``, ``up_blocks``, ``final_block``, ``final_proj``) in upstream's
order, with the attention bias given as an input; :func:`padded_bias` builds that bias
outside the graph without reading the device (``serving-models/tests`` checks it against
:func:`attention_bias`, which calls upstream's own mask functions).
:class:`GraphedEstimator` replaces ``flow.decoder.estimator``: upstream's CFM solver
(``CausalConditionalCFM.solve_euler``) calls it unchanged, and it pads each call's frames up
to a bucket and replays that bucket's graph.

Right-padding leaves the real frames' output unchanged: every convolution of the decoder is
causal (``CausalConv1d``, ``CausalBlock1D``), the padding is masked (``mask`` 0: the resnets
multiply by it and the bias hides padded keys from every real query), and the chunk mask only
lets a frame see its own chunk and earlier ones. ``serving-models/tests`` checks the padded
result against upstream's ``forward`` on the same inputs.

Only the one-level U-Net CosyVoice2 releases use (``channels: [256]``: every block works at
the input's length) is graphed; another layout runs upstream's forward eagerly.
"""

from __future__ import annotations

from typing import Any

BUCKET_FRAMES = 128


def attention_bias(est: Any, mask: Any, streaming: bool) -> Any:
    """The additive attention bias upstream's forward builds for ``mask`` [B, 1, T]."""
    from cosyvoice.utils.common import mask_to_bias  # type: ignore[import-not-found]
    from cosyvoice.utils.mask import add_optional_chunk_mask  # type: ignore[import-not-found]

    frames = mask.shape[-1]
    probe = mask.new_zeros(mask.shape[0], frames, 1)  # only its length is read
    if streaming:
        chunk = add_optional_chunk_mask(
            probe, mask.bool(), False, False, 0, est.static_chunk_size, -1
        )
    else:
        chunk = add_optional_chunk_mask(probe, mask.bool(), False, False, 0, 0, -1)
        chunk = chunk.repeat(1, frames, 1)
    return mask_to_bias(chunk, mask.dtype)


def padded_bias(est: Any, mask: Any, streaming: bool) -> Any:
    """:func:`attention_bias` without reading the device: the same bias for a ``mask`` whose
    every row has a valid key (always, for token2wav: the mask is ones, then the padding's
    zeros). Upstream turns a row with no valid key into all-valid; here it stays all-masked,
    which gives the same uniform attention. A query sees the keys of its own chunk and of
    earlier ones (``static_chunk_size`` frames) when streaming, every key otherwise; padded
    keys never."""
    import torch

    frames = mask.shape[-1]
    keys = mask.bool()  # [B, 1, T]
    if streaming:
        index = torch.arange(frames, device=mask.device)
        chunk = index // est.static_chunk_size
        keys = keys & (chunk[None, :] <= chunk[:, None])[None]  # [B, T, T]
    else:
        keys = keys.expand(-1, frames, -1)
    return (1.0 - keys.to(mask.dtype)) * -1.0e10


def graphable(est: Any) -> bool:
    """Whether :func:`estimate` reproduces ``est``'s forward (the one-level layout)."""
    return len(est.down_blocks) == 1 and len(est.up_blocks) == 1


def estimate(est: Any, x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, bias: Any) -> Any:
    """Upstream's decoder forward with the attention bias as an input (no host reads)."""
    import torch

    t = est.time_mlp(est.time_embeddings(t).to(t.dtype))
    parts = [x, mu]
    if spks is not None:
        parts.append(spks[:, :, None].expand(-1, -1, x.shape[-1]))
    if cond is not None:
        parts.append(cond)
    h = torch.cat(parts, dim=1)

    def attend(h: Any, blocks: Any) -> Any:
        h = h.transpose(1, 2).contiguous()
        for block in blocks:
            h = block(hidden_states=h, attention_mask=bias, timestep=t)
        return h.transpose(1, 2).contiguous()

    ((resnet, blocks, downsample),) = est.down_blocks
    h = attend(resnet(h, mask, t), blocks)
    skip = h
    h = downsample(h * mask)
    for resnet, blocks in est.mid_blocks:
        h = attend(resnet(h, mask, t), blocks)
    ((resnet, blocks, upsample),) = est.up_blocks
    h = torch.cat([h[:, :, : skip.shape[-1]], skip], dim=1)
    h = upsample(attend(resnet(h, mask, t), blocks) * mask)
    h = est.final_block(h, mask)
    return est.final_proj(h * mask) * mask


class _Bucket:
    """Static inputs, output and graph of one padded length."""

    def __init__(self, torch: Any, est: Any, batch: int, frames: int, device: Any, pool: Any):
        dtype = next(est.parameters()).dtype
        channels = est.in_channels  # x, mu, spks (as channels) and cond: 4 x 80

        def zeros(*shape: int) -> Any:
            return torch.zeros(*shape, device=device, dtype=dtype)

        mel = channels // 4
        self.x, self.mu, self.cond = (
            zeros(batch, mel, frames),
            zeros(batch, mel, frames),
            zeros(batch, mel, frames),
        )
        self.mask, self.t, self.spks = zeros(batch, 1, frames), zeros(batch), zeros(batch, mel)
        self.bias = zeros(batch, frames, frames)
        self.frames = frames
        args = (self.x, self.mask, self.mu, self.t, self.spks, self.cond, self.bias)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                estimate(est, *args)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph, pool=pool):
            self.out = estimate(est, *args)

    def run(self, x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, bias: Any) -> Any:
        n = x.shape[-1]
        for static, value in ((self.x, x), (self.mu, mu), (self.cond, cond), (self.mask, mask)):
            static[:, :, :n].copy_(value)
            static[:, :, n:].zero_()
        self.t.copy_(t)
        self.spks.copy_(spks)
        self.bias.copy_(bias)
        self.graph.replay()
        return self.out[:, :, :n].clone()


class GraphedEstimator:
    """Drop-in for ``flow.decoder.estimator``: a torch module whose call pads the frames up to
    a multiple of ``bucket`` and replays that length's CUDA graph (captured in
    :meth:`capture`, each replayed once there, so a bad one fails at load, not under load).
    Longer inputs, and any call before capture, run :func:`estimate` eagerly. With ``dtype``
    (float16, as upstream builds the estimator's TensorRT plan) the estimator's weights are
    converted and each call's inputs cast to it, its output back to the caller's type."""

    def __new__(
        cls, est: Any, max_frames: int, bucket: int = BUCKET_FRAMES, dtype: Any = None
    ) -> Any:
        import torch

        if dtype is not None:
            est.to(dtype)

        class _Module(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.inner = est
                self.bucket = bucket
                self.lengths = list(range(bucket, max_frames + bucket, bucket))
                self.graphs: dict[int, _Bucket] = {}
                self.replays = 0
                self.eager = 0

            @property
            def static_chunk_size(self) -> int:
                return int(est.static_chunk_size)

            def capture(self, batch: int = 2) -> None:
                device = next(est.parameters()).device
                pool = torch.cuda.graph_pool_handle()
                for frames in sorted(self.lengths, reverse=True):  # largest first: one pool
                    self.graphs[frames] = _Bucket(torch, est, batch, frames, device, pool)
                for frames, bucket_ in self.graphs.items():
                    ones = torch.ones(batch, 1, frames, device=device, dtype=bucket_.x.dtype)
                    bucket_.run(
                        bucket_.x,
                        ones,
                        bucket_.mu,
                        bucket_.t,
                        bucket_.spks,
                        bucket_.cond,
                        padded_bias(est, ones, True),
                    )
                torch.cuda.synchronize(device)

            def forward(
                self,
                x: Any,
                mask: Any,
                mu: Any,
                t: Any,
                spks: Any = None,
                cond: Any = None,
                streaming: bool = False,
            ) -> Any:
                frames = x.shape[-1]
                padded = -(-frames // self.bucket) * self.bucket
                chosen = self.graphs.get(padded)
                if chosen is None or x.shape[0] != chosen.x.shape[0]:
                    self.eager += 1
                    return estimate(
                        est, x, mask, mu, t, spks, cond, attention_bias(est, mask, streaming)
                    )
                full = torch.zeros(mask.shape[0], 1, padded, device=mask.device, dtype=mask.dtype)
                full[:, :, :frames] = mask
                self.replays += 1
                return chosen.run(x, mask, mu, t, spks, cond, padded_bias(est, full, streaming))

        return _Module()
