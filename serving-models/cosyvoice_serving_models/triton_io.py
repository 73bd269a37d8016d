"""Reading a request's tensors in a Triton Python model, in host memory.

Every model of ``models/`` takes its inputs as NumPy: the rendered configs force them into host
memory (``FORCE_CPU_ONLY_INPUT_TENSORS``), and the orchestrators ask every BLS response there.
A tensor found in device memory anyway is an error, never a silent copy. The backend's module
(``triton_python_backend_utils``) exists only inside the Python-backend stub, so it is imported
when a tensor is read, not when this module is.
"""

from __future__ import annotations

from typing import Any


def host_array(tensor: Any) -> Any:
    """The NumPy array of a ``pb_utils.Tensor`` held in host memory."""
    if not tensor.is_cpu():
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

        raise pb_utils.TritonModelException(f"tensor {tensor.name()} is in device memory")
    return tensor.as_numpy()


def input_array(request: Any, name: str, required: bool = True) -> Any:
    """Input ``name`` of ``request`` as a NumPy array; ``None`` for an absent optional input,
    ``ValueError`` for an absent required one."""
    import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if required:
            raise ValueError(f"input {name} is missing")
        return None
    return host_array(tensor)
