"""The narrowest stand-ins for the two CosyVoice3 networks no PyPI package holds (README, "The
PyPI packages against the pinned commit"): upstream's ``CausalMaskedDiffWithDiT`` (the flow)
and ``CausalHiFTGenerator`` (the vocoder). Only the networks are fake; the code under test
(``cosyvoice3_token2wav``, ``models/token2wav``, ``models/vocoder``) builds them from a
release yaml with hyperpyyaml, loads their checkpoints strictly and calls them as upstream's
library is called. Each keeps what the tests check:

- :class:`FakeDiTFlow` has upstream's ``inference`` signature and ``token_mel_ratio``; its mel
  depends on the prompt and every token, and it records the arguments of its last call;
- :class:`FakeCausalHiFT` draws random excitation tables when it is built, as upstream's
  causal ``SineGen2`` / ``SourceModuleHnNSF`` do (plain attributes, not in the checkpoint),
  so two instances built without a common seed disagree; it is causal (its audio up to a
  frame depends on the mel up to that frame) and, unless ``finalize``, leaves out the samples
  of its look-ahead frames, as upstream's does.
"""

from __future__ import annotations

from typing import Any

import torch

SAMPLES_PER_FRAME = 480
LOOK_AHEAD_FRAMES = 4
PRE_LOOKAHEAD_TOKENS = 3
TABLE_SAMPLES = 60 * 24000


class FakeDiTFlow(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, vocab_size: int = 6561, output_size: int = 80, token_mel_ratio: int = 2):
        super().__init__()
        self.token_mel_ratio = token_mel_ratio
        self.input_embedding = torch.nn.Embedding(vocab_size, output_size)
        self.spk_embed_affine_layer = torch.nn.Linear(192, output_size)
        self.last_call: dict[str, Any] = {}

    def inference(
        self,
        token: Any,
        token_len: Any,
        prompt_token: Any,
        prompt_token_len: Any,
        prompt_feat: Any,
        prompt_feat_len: Any,
        embedding: Any,
        streaming: bool,
        finalize: bool,
    ) -> tuple[Any, None]:
        self.last_call = {
            "token": token.clone(),
            "prompt_token": prompt_token.clone(),
            "prompt_feat": prompt_feat.clone(),
            "embedding": embedding.clone(),
            "lengths": [int(token_len[0]), int(prompt_token_len[0]), int(prompt_feat_len[0])],
            "streaming": streaming,
            "finalize": finalize,
            "device": str(token.device),
        }
        assert token.shape[0] == 1 and token.dtype == torch.int32
        assert torch.is_inference_mode_enabled()  # the caller's, as upstream decorates it
        speaker = self.spk_embed_affine_layer(torch.nn.functional.normalize(embedding, dim=1))
        every = torch.concat([prompt_token, token], dim=1).long()
        if not finalize:  # upstream's pre-look-ahead layer takes the last tokens as context only
            every = every[:, :-PRE_LOOKAHEAD_TOKENS]
        h = self.input_embedding(torch.clamp(every, min=0)) / 8 + speaker[:, None, :]
        h = h + prompt_feat.mean(dim=1, keepdim=True)  # [1, P + T, 80]
        mel = torch.cumsum(h, dim=1).repeat_interleave(self.token_mel_ratio, dim=1)
        return mel[:, prompt_feat.shape[1] :].transpose(1, 2).float(), None


class FakeCausalHiFT(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, in_channels: int = 80):
        super().__init__()
        self.conv_post = torch.nn.Linear(in_channels, 1)
        self.rand_ini = torch.rand(1, 9)
        self.sine_waves = torch.rand(1, TABLE_SAMPLES, 9)

    def inference(self, speech_feat: Any, finalize: bool = True) -> tuple[Any, Any]:
        frames = speech_feat.shape[2] if finalize else speech_feat.shape[2] - LOOK_AHEAD_FRAMES
        level = torch.tanh(self.conv_post(speech_feat[0, :, :frames].transpose(0, 1)))  # [F, 1]
        samples = level.repeat_interleave(SAMPLES_PER_FRAME, dim=0)[:, 0]
        phase = self.rand_ini[0, 1].to(samples.device)
        noise = self.sine_waves[0, : samples.shape[0], 3].to(samples.device)
        speech = 0.5 * samples + 0.1 * torch.sin(phase + noise)
        return speech[None], noise[None, None]


def release_yaml(base: str = "") -> str:
    """A ``cosyvoice3.yaml`` of upstream's layout (seeds, scalars, the LLM, flow and hift
    entries, a feature extractor) whose flow and hift are the fakes and whose LLM names a
    module that does not exist: loading the whole file fails, building only the entries the
    model needs does not. ``base``: top-level entries to keep (the tiny release's
    ``feat_extractor``, which the orchestrator reads)."""
    return (
        "__set_seed1: !apply:random.seed [1986]\n"
        "__set_seed3: !apply:torch.manual_seed [1986]\n"
        "sample_rate: 24000\n"
        "spk_embed_dim: 192\n"
        "token_mel_ratio: 2\n"
        "chunk_size: 25 # streaming inference chunk size, in token\n"
        "qwen_pretrain_path: ''\n"
        "llm: !new:cosyvoice.llm.llm_missing_here.CosyVoice3LM\n"
        "    llm_input_size: 896\n"
        "flow: !new:cv3_fakes.FakeDiTFlow\n"
        "    vocab_size: 6561\n"
        "    token_mel_ratio: !ref <token_mel_ratio>\n"
        "hift: !new:cv3_fakes.FakeCausalHiFT\n"
        "    in_channels: 80\n" + base
    )


def write_release(model_dir: Any, base: str = "") -> None:
    """``cosyvoice3.yaml``, ``flow.pt`` and ``hift.pt`` (its keys under ``generator.``, as the
    released checkpoint has them) in ``model_dir``."""
    from pathlib import Path

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "cosyvoice3.yaml").write_text(release_yaml(base))
    torch.manual_seed(5)
    torch.save(FakeDiTFlow().state_dict(), model_dir / "flow.pt")
    hift = FakeCausalHiFT().state_dict()
    torch.save({f"generator.{k}": v for k, v in hift.items()}, model_dir / "hift.pt")
