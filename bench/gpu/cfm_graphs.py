"""Issue 32, item 4 (a measurement, not serving code): the flow's whole CFM solve as one CUDA
graph per padded length, against ``flow_graphs.GraphedEstimator``'s graph per estimator call.

``serving-models``' token2wav replays one graph per estimator call: each of the 10 Euler
steps still runs, eagerly, upstream's solver around it (the CFG inputs' copies, the time
step's arithmetic), our padding (static inputs copied in, the attention bias rebuilt, the
output cloned out). :class:`GraphedCFM` replaces ``flow.decoder`` (upstream's
``CausalConditionalCFM``) and captures all of it for a padded length: the noise, the 10
steps, classifier-free guidance and the Euler updates, with the attention bias built once
inside the graph. What stays eager is the flow's encoder (``UpsampleConformerEncoder``) and
its host reads (``make_pad_mask``).

Same arithmetic as upstream's ``solve_euler``: the time schedule is computed by the same
float32 operations (on the host, once), the estimator runs in float16 on float16 inputs
as ``GraphedEstimator`` runs it, the update in float32. The noise is upstream's fixed
``rand_noise`` buffer, padded frames included; padded frames do not reach real ones (the
decoder is causal and masked: ``flow_graphs``' module docstring).

``token2wav_speed.py`` times it beside eager and ``GraphedEstimator`` on the device, and
compares their mels.
"""

from __future__ import annotations

from typing import Any


def schedule(steps: int, scheduler: str) -> list[tuple[float, float]]:
    """(t, dt) of each Euler step, as upstream's ``solve_euler`` computes them in float32."""
    import torch

    span = torch.linspace(0, 1, steps + 1, dtype=torch.float32)
    if scheduler == "cosine":
        span = 1 - torch.cos(span * 0.5 * torch.pi)
    t, dt = span[0], span[1] - span[0]
    out = []
    for step in range(1, steps + 1):
        out.append((float(t), float(dt)))
        t = t + dt
        if step < steps:
            dt = span[step + 1] - t
    return out


def solve(
    est: Any,
    z: Any,
    mu: Any,
    mask: Any,
    spks: Any,
    cond: Any,
    steps: list[tuple[float, float]],
    cfg_rate: float,
    streaming: bool,
) -> Any:
    """The CFM solve with classifier-free guidance, on fixed shapes (capturable): ``z``, ``mu``
    and ``cond`` [1, 80, T] float32, ``mask`` [1, 1, T], ``spks`` [1, 80]."""
    import torch

    from cosyvoice_serving_models.flow_graphs import estimate, padded_bias

    half = next(est.parameters()).dtype
    mask2 = torch.cat([mask, mask]).to(half)
    mu2 = torch.cat([mu, torch.zeros_like(mu)]).to(half)
    spks2 = torch.cat([spks, torch.zeros_like(spks)]).to(half)
    cond2 = torch.cat([cond, torch.zeros_like(cond)]).to(half)
    bias = padded_bias(est, mask2, streaming)
    x = z
    for t, dt in steps:
        time = torch.full((2,), t, device=z.device, dtype=half)
        both = estimate(est, torch.cat([x, x]).to(half), mask2, mu2, time, spks2, cond2, bias)
        d, uncond = both.float().split(1)
        x = x + dt * ((1.0 + cfg_rate) * d - cfg_rate * uncond)
    return x


def graphed_cfm(cfm: Any, est: Any, bucket: int = 128) -> Any:
    """A module standing in for ``flow.decoder`` (``cfm``): called as upstream's flow calls it,
    it pads to a multiple of ``bucket`` and replays that length's graph (captured at its
    first call, for streaming and offline apart)."""
    import torch

    class _Graph:
        def __init__(self, frames: int, streaming: bool, device: Any, steps: Any) -> None:
            def zeros(*shape: int) -> Any:
                return torch.zeros(*shape, device=device, dtype=torch.float32)

            self.z = cfm.rand_noise[:, :, :frames].to(device).float().clone()
            self.mu, self.cond = zeros(1, 80, frames), zeros(1, 80, frames)
            self.mask, self.spks = zeros(1, 1, frames), zeros(1, 80)
            args = (est, self.z, self.mu, self.mask, self.spks, self.cond, steps)
            rate = float(cfm.inference_cfg_rate)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(2):
                    solve(*args, rate, streaming)
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(self.graph):
                self.out = solve(*args, rate, streaming)

        def run(self, mu: Any, mask: Any, spks: Any, cond: Any) -> Any:
            n = mu.shape[-1]
            for static, value in ((self.mu, mu), (self.cond, cond), (self.mask, mask)):
                static[:, :, :n].copy_(value)
                static[:, :, n:].zero_()
            self.spks.copy_(spks)
            self.graph.replay()
            return self.out[:, :, :n].clone()

    class _Module(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.inner = cfm
            self.graphs: dict[tuple[int, bool], _Graph] = {}
            self.replays = 0

        def forward(
            self,
            mu: Any,
            mask: Any,
            n_timesteps: int,
            temperature: float = 1.0,
            spks: Any = None,
            cond: Any = None,
            streaming: bool = False,
        ) -> tuple[Any, None]:
            assert temperature == 1.0 and mu.shape[0] == 1
            frames = mu.shape[-1]
            padded = -(-frames // bucket) * bucket
            key = (padded, streaming)
            if key not in self.graphs:
                steps = schedule(n_timesteps, cfm.t_scheduler)
                self.graphs[key] = _Graph(padded, streaming, mu.device, steps)
            self.replays += 1
            return self.graphs[key].run(mu.float(), mask.float(), spks.float(), cond.float()), None

    return _Module()
