"""The orchestrators' reading of a request's reference speaker (``triton_io.reference_audio``),
with the backend's module stood in: its two functions the helper calls, on host tensors."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from cosyvoice_serving_models import triton_io


class HostTensor:
    def __init__(self, name: str, array: Any, cpu: bool = True) -> None:
        self._name, self._array, self._cpu = name, array, cpu

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return self._cpu

    def as_numpy(self) -> Any:
        return self._array


class ModelException(Exception):
    pass


@pytest.fixture(autouse=True)
def backend(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = types.ModuleType("triton_python_backend_utils")
    stub.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    stub.TritonModelException = ModelException  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)


def request(**arrays: Any) -> dict[str, HostTensor]:
    return {name: HostTensor(name, array) for name, array in arrays.items()}


def test_no_reference_wav_means_the_default_speaker() -> None:
    assert triton_io.reference_audio(request(reference_text=np.array([b"hi"]))) is None


def test_the_wave_is_cut_to_its_length_and_the_text_decoded() -> None:
    wav = np.arange(10, dtype=np.float32).reshape(1, 10)
    got = triton_io.reference_audio(
        request(
            reference_wav=wav,
            reference_wav_len=np.array([[4]], dtype=np.int32),
            reference_text=np.array([["你好".encode()]], dtype=object),
        )
    )
    assert got is not None
    cut, text = got
    assert cut.shape == (1, 4) and cut.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert text == "你好"


def test_without_length_or_text_the_whole_wave_and_no_text() -> None:
    got = triton_io.reference_audio(request(reference_wav=np.ones(6, dtype=np.float32)))
    assert got is not None and got[0].shape == (1, 6) and got[1] == ""


def test_a_reference_in_device_memory_is_an_error_not_a_copy() -> None:
    req = {"reference_wav": HostTensor("reference_wav", np.ones(3), cpu=False)}
    with pytest.raises(ModelException, match="reference_wav is in device memory"):
        triton_io.reference_audio(req)
