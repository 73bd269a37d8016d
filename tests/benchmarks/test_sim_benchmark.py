"""Small versions of the benchmarks under ``bench/``: each runs what its full-size benchmark
runs, at a size CI can afford, and checks the shape and the invariants of the result (not its
speed). Kept out of ``tests/unit`` so that ``make unit`` stays quick."""

from __future__ import annotations

import json

import pytest

from cosyvoice_operator.cli.main import main


def test_the_default_benchmark_at_ci_size(capsys: pytest.CaptureFixture[str]) -> None:
    """`cosyvoice-operator sim --small`: the conversation trace split in time, a 3-hour day and
    an outage, one seed, the small sweep (~10 s)."""
    assert main(["sim", "--small", "--seeds", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    summary = document["summary"]
    assert summary["train"] == "azure_llm_2023_conv.csv#train"
    assert summary["evals"] == [
        "azure_llm_2023_conv.csv#eval",
        "diurnal-day",
        "prometheus-outage-10min",
        "diurnal-day-deep",
    ]
    assert summary["defaults"]["cold_start_s"] == 180.0
    assert summary["defaults"]["slo_first_audio_s"] == 1.5
    # Tens of replicas: the training trace's mean load at x5.
    assert 15 < summary["train_mean_load_pods"] < 35
    goals = {g["trace"]: g for g in summary["goal"]}
    assert set(goals) == set(summary["evals"])
    # Our policy never scales down for lack of data; KEDA does in the outage.
    outage = [r for r in document["runs"] if r["trace"] == "prometheus-outage-10min"]
    assert all(r["missing_data_scale_downs"] == 0 for r in outage if r["policy"] == "cosyvoice")
    assert any(r["missing_data_scale_downs"] > 0 for r in outage if r["policy"] == "keda")
