"""Traces, selection on the training trace, and ``cosyvoice-operator sim`` end to end (small)."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.cli.main import main
from cosyvoice_operator.devtools.sim import command as sim_command
from cosyvoice_operator.devtools.sim import experiment, trace
from cosyvoice_operator.devtools.sim.experiment import Summary, select


def write_trace(path: Path, minutes: float, rate: float, seed: int = 3) -> Path:
    """A CSV like the Azure trace: 7-digit fractions, tokens of 1-12 s of audio."""
    rng = random.Random(seed)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= 60 * minutes:
            break
        whole = int(t)
        stamp = f"2023-11-16 18:{whole // 60:02d}:{whole % 60:02d}.{int((t % 1) * 1e7):07d}"
        lines.append(f"{stamp},100,{rng.randint(25, 300)}")
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- traces ---------------------------------------------------------------------------------


def test_load_csv_reads_the_azure_format(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:46.6805900,374,50\n"
    )
    t = trace.load_csv(path)
    assert t.arrivals == pytest.approx((0.0, 4.314579))  # sorted, from the first
    assert t.audio == pytest.approx((2.0, 4.36))  # tokens / 25
    assert t.name == "t.csv"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,GeneratedTokens\n1,2\n", "no TIMESTAMP column"),
        ("TIMESTAMP,tokens\n1,2\n", "no GeneratedTokens column"),
        ("TIMESTAMP,GeneratedTokens\nyesterday,2\n", "t.csv:2: TIMESTAMP 'yesterday'"),
        ("TIMESTAMP,GeneratedTokens\n1,many\n", "t.csv:2: GeneratedTokens 'many' is not a number"),
        ("TIMESTAMP,GeneratedTokens\n", "the trace has no rows"),
    ],
)
def test_bad_traces_say_what_and_where(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(trace.TraceError, match=message):
        trace.load_csv(path)


def test_split_multiply_and_modulate(tmp_path: Path) -> None:
    t = trace.load_csv(write_trace(tmp_path / "t.csv", 20, 2.0))
    train, evaluation = trace.split(t)
    assert len(train) + len(evaluation) == len(t)
    assert train.duration_s == pytest.approx(t.duration_s / 2)
    assert max(train.arrivals) < train.duration_s and min(evaluation.arrivals) >= 0
    assert (train.name, evaluation.name) == ("t.csv#train", "t.csv#eval")
    assert len(trace.multiply(t, 3.0, seed=1)) == 3 * len(t)
    assert len(trace.multiply(t, 2.5, seed=1)) == pytest.approx(2.5 * len(t), rel=0.05)
    stepped = trace.modulate(t, trace.step(600.0, 1.0, 2.0), seed=1)
    counts = stepped.per_minute()
    assert sum(counts[12:19]) > 1.6 * sum(counts[2:9])


def test_diurnal_day_has_the_envelope_and_keeps_the_bursts(tmp_path: Path) -> None:
    assert trace.diurnal_envelope(4.0) == pytest.approx(0.2)
    assert max(trace.diurnal_envelope(h / 4) for h in range(96)) == pytest.approx(1.0, abs=0.01)
    source = trace.load_csv(write_trace(tmp_path / "t.csv", 30, 1.0))
    day = trace.diurnal_day(source, seed=2, peak_factor=2.0)
    assert day.duration_s == 86_400.0
    hourly = [sum(day.per_minute()[60 * h : 60 * h + 60]) for h in range(24)]
    assert hourly.index(min(hourly)) in (3, 4, 5)
    mean_per_minute = len(source) / 30
    # The peak hour carries peak_factor times the source's mean load.
    assert max(hourly) / 60 == pytest.approx(2.0 * mean_per_minute, rel=0.15)
    assert trace.diurnal_day(source, seed=2, peak_factor=2.0) == day  # seeded


def test_the_deep_trough_day_and_the_week(tmp_path: Path) -> None:
    assert trace.diurnal_envelope(4.0, trough=0.05) == pytest.approx(0.05)
    assert trace.diurnal_envelope(15.0, trough=0.05) > 0.9
    source = trace.load_csv(write_trace(tmp_path / "t.csv", 30, 2.0))
    deep = trace.diurnal_day(source, seed=2, peak_factor=2.0, trough=0.05)
    hourly = [sum(deep.per_minute()[60 * h : 60 * h + 60]) for h in range(24)]
    assert min(hourly) < 0.12 * max(hourly)  # the 0.2 day's trough is about 0.2
    week = trace.diurnal_day(source, seed=2, peak_factor=2.0, days=7, weekend=0.5)
    assert week.duration_s == 7 * 86_400.0
    daily = [sum(week.per_minute()[1440 * d : 1440 * d + 1440]) for d in range(7)]
    weekday, weekend = sum(daily[:5]) / 5, sum(daily[5:]) / 2
    assert weekend / weekday == pytest.approx(0.5, rel=0.1)
    assert trace.diurnal_day(source, seed=2, peak_factor=2.0, days=7, weekend=0.5) == week


# ---- selection ------------------------------------------------------------------------------


def summary(policy: str, attainment: float, gpu: float, **params: float) -> Summary:
    return Summary("t", policy, dict(params), attainment, gpu, 3.0, 0.0, 0, 1.0, (0, 1), (0, 1))


def test_selection_picks_the_cheapest_configuration_at_99_percent() -> None:
    sweep = [
        summary("hpa", 0.995, 30.0, target=1),
        summary("hpa", 0.990, 20.0, target=2),
        summary("hpa", 0.989, 10.0, target=3),  # cheaper, but misses the goal
        summary("hpa", 0.999, 25.0, target=4),
    ]
    chosen = select(sweep)
    assert chosen is not None and chosen.params == {"target": 2}


def test_selection_without_any_at_99_percent_takes_the_closest() -> None:
    chosen = select([summary("kpa", 0.95, 10.0, t=1), summary("kpa", 0.97, 30.0, t=2)])
    assert chosen is not None and chosen.params == {"t": 2}
    assert select([]) is None


# ---- the command ----------------------------------------------------------------------------

RUN_KEYS = {
    "trace": str,
    "policy": str,
    "params": dict,
    "tuned_on": str,
    "slo_attainment": float,
    "gpu_hours": float,
    "scale_events": int,
    "reversals": int,
    "missing_data_scale_downs": int,
    "p95_first_audio_s": float,
}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small train/eval run of the command, as JSON."""
    work = tmp_path_factory.mktemp("sim")
    train = write_trace(work / "train.csv", 25, 1.5, seed=1)
    evaluation = write_trace(work / "eval.csv", 25, 2.5, seed=2)
    argv = [
        "sim",
        "--train",
        str(train),
        "--eval",
        str(evaluation),
        "--small",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--multiplier",
        "1",
        "--outage",
        "600:300",
        "--json",
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    document: dict[str, Any] = json.loads(out.getvalue())
    return document


def test_json_has_every_run_of_every_sweep_in_the_issue_schema(small_run: dict[str, Any]) -> None:
    runs = small_run["runs"]
    assert {r["policy"] for r in runs} == {
        "cosyvoice",
        "hpa",
        "hpa-concurrency",
        "keda",
        "keda-fallback",
        "llmd",
        "kpa",
        "static",
    }
    assert {r["trace"] for r in runs} == {"train.csv", "eval.csv"}
    for run in runs:
        for key, kind in RUN_KEYS.items():
            assert isinstance(run[key], kind), (key, run)
        assert 0.0 <= run["slo_attainment"] <= 1.0
        assert run["gpu_hours"] > 0
    # Each baseline: its training-tuned configuration runs on the evaluation trace.
    tuned = [r for r in runs if r["trace"] == "eval.csv" and r["tuned_on"] == "train.csv"]
    assert {r["policy"] for r in tuned} == {
        "cosyvoice",
        "hpa",
        "hpa-concurrency",
        "keda",
        "keda-fallback",
        "llmd",
        "kpa",
        "static",
    }
    chosen = small_run["summary"]["chosen_on_train"]
    for r in tuned:
        assert r["params"] == chosen[r["policy"]]["params"]
    # The sweep (2 targets x the distinct floors x 1 window for hpa) runs on both traces.
    hpa = [r for r in runs if r["policy"] == "hpa"]
    floors = {r["params"]["min_replicas"] for r in hpa}
    for name in ("train.csv", "eval.csv"):
        points = [json.dumps(r["params"], sort_keys=True) for r in hpa if r["trace"] == name]
        assert len(points) == len(set(points)) == 2 * len(floors)


def test_the_training_choice_is_the_cheapest_at_99_percent(small_run: dict[str, Any]) -> None:
    runs = [r for r in small_run["runs"] if r["trace"] == "train.csv"]
    for policy, chosen in small_run["summary"]["chosen_on_train"].items():
        candidates = [r for r in runs if r["policy"] == policy]
        reaching = [r for r in candidates if r["slo_attainment"] >= 0.99]
        if reaching:
            assert chosen["gpu_hours"] == pytest.approx(min(r["gpu_hours"] for r in reaching))
        else:
            assert chosen["slo_attainment"] == max(r["slo_attainment"] for r in candidates)


def test_reused_runs_are_not_simulated_again(
    small_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reuse = experiment.reusable(small_run, ("hpa", "kpa"))
    assert reuse and {key[2] for key in reuse} == {"hpa", "kpa"}
    first = next(r for r in small_run["runs"] if r["policy"] == "hpa")
    kept = reuse[experiment.run_key(first["trace"], first["seed"], "hpa", first["params"])]
    assert (kept.gpu_hours, kept.scale_events) == (first["gpu_hours"], first["scale_events"])
    ran: list[str] = []
    real = experiment._run

    def counting(task: experiment.Task) -> experiment.Run:
        ran.append(task.policy)
        return real(task)

    monkeypatch.setattr(experiment, "_run", counting)
    train = write_trace(tmp_path / "train.csv", 25, 1.5, seed=1)
    evaluation = write_trace(tmp_path / "eval.csv", 25, 2.5, seed=2)
    exp = experiment.files_experiment(
        str(train), [str(evaluation)], 1.0, 1, "GeneratedTokens", 25.0, ((600.0, 300.0),)
    )
    exp = dataclasses.replace(exp, sweep=experiment.SMALL_SWEEP, jobs=1)
    result = experiment.run_experiment(exp, reuse=reuse)
    assert "hpa" not in ran and "kpa" not in ran and "keda" in ran
    hpa = [r for r in result.runs if r.policy == "hpa"]
    assert hpa and all(r.outcome.timeline == () for r in hpa)


def test_the_outage_shows_as_missing_data_scale_downs_for_keda_only(
    small_run: dict[str, Any],
) -> None:
    evaluation = [r for r in small_run["runs"] if r["trace"] == "eval.csv"]
    by_policy: dict[str, int] = {}
    for r in evaluation:
        by_policy[r["policy"]] = by_policy.get(r["policy"], 0) + r["missing_data_scale_downs"]
    assert by_policy["keda"] > 0
    assert by_policy["cosyvoice"] == by_policy["hpa"] == by_policy["hpa-concurrency"] == 0


def test_the_default_output_is_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = write_trace(tmp_path / "a.csv", 15, 1.0, seed=1)
    argv = [
        "sim",
        "--train",
        str(train),
        "--eval",
        str(train),
        "--small",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--multiplier",
        "1",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "SLO met" in out and "GPU-h" in out
    assert "a.csv" in out and "hpa-concurrency" in out and "Goal" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train", "/nonexistent.csv", "--eval", "/nonexistent.csv"], "no such file"),
        (["--train", "x.csv"], "--train and --eval go together"),
        (["--slo", "0"], "must be > 0"),
        (["--outage", "ten"], "expected START:SECONDS"),
    ],
)
def test_bad_input_is_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["sim", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_trace_without_timestamp_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,GeneratedTokens\n1,2\n")
    assert main(["sim", "--train", str(bad), "--eval", str(bad)]) == 2
    assert "no TIMESTAMP column" in capsys.readouterr().err


SHARED_TRACE = Path(__file__).resolve().parents[4] / "shared/traces/azure_llm_2023_conv.csv"


def test_the_conversation_trace_ships_in_the_package_with_its_attribution() -> None:
    """`sim` runs from a plain clone: the trace is package data, not a file beside the checkout."""
    packaged = sim_command.default_trace()
    assert packaged == sim_command.PACKAGED_TRACE and packaged.is_file()
    loaded = trace.load_csv(packaged)
    assert loaded.name == "azure_llm_2023_conv.csv" and len(loaded) == 19_366
    notice = (packaged.parent / "README.md").read_text()
    for needed in ("Creative Commons Attribution 4.0", "Splitwise", "ISCA 2024"):
        assert needed.lower() in notice.lower(), needed
    if SHARED_TRACE.is_file():  # the copy is the data set, byte for byte
        assert gzip.decompress(packaged.read_bytes()) == SHARED_TRACE.read_bytes()


def test_a_missing_trace_says_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(sim_command.DEFAULT_TRACE_ENV, str(tmp_path / "nope.csv"))
    assert main(["sim", "--small"]) == 2
    err = capsys.readouterr().err
    assert "COSYVOICE_SIM_TRACE names" in err and "AzureLLMInferenceTrace_conv.csv" in err
    assert "CC-BY-4.0" in err and len(err.strip().splitlines()) == 1
