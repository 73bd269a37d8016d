"""Reference audio -> speaker embedding, as upstream computes it: Kaldi fbank features
(``torchaudio.compliance.kaldi.fbank``: 80 bins, no dither, 16 kHz), their mean over time
taken off, through the release's CAM++ network ``campplus.onnx`` in ONNX Runtime; 192 values,
returned as float16.

On the device the instance was given: ``cuda:<n>`` runs the network with ONNX Runtime's CUDA
provider on GPU ``n`` and refuses to load when that provider is missing (no silent fall-back
to the CPU); ``cpu`` with the CPU provider and one thread, as upstream's ONNX path does. The
engine builder also prebuilt the network as a TensorRT plan (the manifest's
``speakerEmbeddingPlan``); :func:`prebuilt_plan` finds it, but it is not loaded yet
(``serving-models/README.md``, "What remains").
"""

from __future__ import annotations

import json
import os
from typing import Any

FBANK_BINS = 80
SAMPLE_RATE = 16000


def session(onnx_path: str, device: str) -> Any:
    """An ONNX Runtime session of ``onnx_path`` on ``device`` (``cpu`` or ``cuda:<n>``)."""
    import onnxruntime  # type: ignore[import-not-found]

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    if device.startswith("cuda:"):
        wanted = "CUDAExecutionProvider"
        providers: list[Any] = [(wanted, {"device_id": int(device.split(":", 1)[1])})]
    else:
        wanted = "CPUExecutionProvider"
        providers = [wanted]
    loaded = onnxruntime.InferenceSession(onnx_path, sess_options=options, providers=providers)
    if loaded.get_providers()[0] != wanted:
        raise RuntimeError(f"{onnx_path}: ONNX Runtime runs it on {loaded.get_providers()}")
    return loaded


def features(wav: Any) -> Any:
    """The network's input for one 16 kHz waveform: ``[1, frames, 80]`` float32."""
    import numpy as np
    import torch
    import torchaudio.compliance.kaldi as kaldi  # type: ignore[import-not-found]

    speech = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32).reshape(1, -1))
    feat = kaldi.fbank(speech, num_mel_bins=FBANK_BINS, dither=0, sample_frequency=SAMPLE_RATE)
    feat = feat - feat.mean(dim=0, keepdim=True)
    return feat.unsqueeze(0).numpy()


def embed(network: Any, wav: Any) -> Any:
    """The speaker embedding of one waveform, float16, flat."""
    import numpy as np

    name = network.get_inputs()[0].name
    out = network.run(None, {name: features(wav)})[0]
    return np.asarray(out, dtype=np.float32).reshape(-1).astype(np.float16)


def prebuilt_plan(manifest: str, plans_dir: str) -> str:
    """The engine's prebuilt TensorRT plan of the network ("" without a manifest or plan)."""
    try:
        with open(manifest) as f:
            layout = json.load(f).get("layout", {})
    except FileNotFoundError:
        return ""
    # The layout's paths are relative to the engine directory ("plans/<file>"); plans_dir
    # is that plans folder as mounted in the pod.
    name = layout.get("speakerEmbeddingPlan", "")
    return os.path.join(plans_dir, os.path.basename(name)) if name else ""
