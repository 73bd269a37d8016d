"""The ``cosyvoice-operator`` command: ``run``, ``render``, ``demo``, ``cluster``, ``sim``."""
