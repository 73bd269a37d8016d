"""`cluster up --gpu-nodes PRODUCT=COUNT`: parsed before anything starts, errors say why."""

from __future__ import annotations

import pytest

from cosyvoice_operator.devtools.localcluster import ClusterError, parse_gpu_nodes


def test_products_and_counts() -> None:
    assert parse_gpu_nodes(["NVIDIA-L20=2", "NVIDIA-H100-80GB-HBM3=1"]) == {
        "NVIDIA-L20": 2,
        "NVIDIA-H100-80GB-HBM3": 1,
    }


def test_a_repeated_product_adds_up() -> None:
    assert parse_gpu_nodes(["NVIDIA-L20=2", "NVIDIA-L20=3"]) == {"NVIDIA-L20": 5}


@pytest.mark.parametrize(
    ("arg", "needle"),
    [
        ("NVIDIA-L20", "PRODUCT=COUNT"),
        ("=2", "PRODUCT=COUNT"),
        ("NVIDIA-L20=two", "PRODUCT=COUNT"),
        ("NVIDIA-L20=-1", "PRODUCT=COUNT"),
        ("NVIDIA L20=1", "not a valid label value"),
        ("-NVIDIA=1", "not a valid label value"),
        (f"NVIDIA-{'L' * 57}=1", "at most 63"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(arg: str, needle: str) -> None:
    with pytest.raises(ClusterError) as info:
        parse_gpu_nodes([arg])
    assert needle in str(info.value) and repr(arg) in str(info.value)


def test_the_longest_label_value_is_accepted() -> None:
    product = f"NVIDIA-{'L' * 56}"
    assert len(product) == 63
    assert parse_gpu_nodes([f"{product}=1"]) == {product: 1}
