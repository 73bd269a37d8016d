"""Engine builder run by the cosyvoice-operator's engine-build Job.

Fetches a CosyVoice model, converts and builds its TensorRT-LLM engine, prebuilds the
TensorRT plans that upstream would otherwise build lazily inside the serving pod, and
publishes everything atomically under ``<cache-dir>/<key>/`` with a digest manifest.
"""

__version__ = "0.1.0"
