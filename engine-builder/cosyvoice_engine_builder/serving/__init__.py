"""The serving container's command (``cosyvoice-serve``, alias ``cosyvoice-engine-builder serve``).

It lives in the builder's package because it checks engines with the code that wrote their
manifests (:mod:`~cosyvoice_engine_builder.manifest`, :mod:`~cosyvoice_engine_builder.layout`,
:func:`~cosyvoice_engine_builder.toolchain.probe_versions`) and runs on the builder's base
image. It does four things in order:

1. **Compatibility gate** (:mod:`.gate`). Reads ``<engine-dir>/manifest.json`` and compares it
   with what this pod runs on: the key the operator expects, the variant, the architecture of
   every visible GPU, this image's TensorRT and TensorRT-LLM versions, the tensor-parallel
   size against the LLM GPU groups, and that every file the manifest lists is there with its
   recorded size (full digests are ``verify``'s job: hashing gigabytes at every start would
   delay every scale-up). Upstream CosyVoice has no such check; a plan loaded under another
   TensorRT or on another architecture gives serialisation errors or, worse, silent audio
   (upstream issues #1831, #954, #1686). Any mismatch is one message naming both sides and
   what to do, on stderr and in the termination message.
2. **Model repository** (:mod:`.repository`). Triton's repository is assembled in a writable
   directory: each ``<model>.pbtxt`` of the operator's ConfigMap becomes
   ``<model>/config.pbtxt``, and ``<model>/1`` links to the model code baked into the image
   (the project's own, or upstream's for the models not ours yet:
   ``serving-image/model-code.list``). Beside it, the **model view**: the engine's
   ``model/`` directory as the models expect their ``model_dir``, with the engine's prebuilt
   plans under the names upstream's code loads (it would otherwise build them again, into a
   read-only volume).
3. **LLM servers** (:mod:`.launch`; cosyvoice3). One ``trtllm-serve`` per GPU group, as
   upstream's ``run_cosyvoice3.sh`` starts it, each on its own port; Triton starts only once
   every one answers ``/health``, so the orchestrator never sees a refused connection.
4. **Triton** (:mod:`.supervisor`). ``tritonserver`` runs as a child; this command answers
   the pod's readiness itself (``GET /ready`` on ``--health-port``, :mod:`.health`: Triton
   ready, every Python stub alive, not draining). SIGTERM is drained here, not in Triton
   (whose BLS calls fail once it is stopping): not ready, new streams refused, Triton kept
   serving until the orchestrators' ``cosyvoice_active_streams`` gauge is 0 or
   ``--drain-seconds`` is up, then stopped. A dead or stopped stub (:mod:`.stubs`), or work in
   flight that makes no progress for ``--stall-seconds`` (a hung stub, :mod:`.progress`),
   makes the pod not ready and Triton is restarted in place. The LLM servers the streams still need
   are stopped only after Triton has exited. ``docs/concepts/draining-and-stub-health.md``.

:mod:`.options` parses the command line, :mod:`.command` ties the steps together, and
:mod:`.exit_codes` lists what the command exits with.
"""
