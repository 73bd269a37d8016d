"""The project's own Triton Python-model code for CosyVoice (see ``serving-models/README.md``).

Pure pieces (``chunking``, ``speakers``, ``device``, ``features``, ``contract``) import NumPy at
most; ``token2wav`` imports torch and upstream CosyVoice's library (``cosyvoice``, ``matcha``)
only when an engine is built.
"""
