"""Fetching from pvc://, hf:// (injected downloader) and s3:// (boto3 fake, aws stand-in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cosyvoice_engine_builder.fetch import Downloaders
from cosyvoice_engine_builder.request import InvalidRequest, parse_model_uri
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
    assert builder.manifest()["model"] == {
        "uri": "hf://yuekai/cosyvoice2_llm",
        "revision": "abc123",
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

# What each Hugging Face repository holds, reduced to the files the build looks at (the
# official repositories have no HF-format LLM; CosyVoice3's has no autocast estimator).
HUB_REPOS: dict[str, dict[str, str]] = {
    "FunAudioLLM/CosyVoice2-0.5B": {
        "campplus.onnx": "campplus",
        "flow.decoder.estimator.fp32.onnx": "fp32 estimator",
        "cosyvoice2.yaml": "yaml",
        "llm.pt": "pytorch llm",
    },
    "yuekai/cosyvoice2_llm": {"config.json": "{}", "model.safetensors": "cv2 llm"},
    "FunAudioLLM/Fun-CosyVoice3-0.5B-2512": {
        "campplus.onnx": "campplus",
        "cosyvoice3.yaml": "yaml",
        "flow.pt": "flow",
    },
    "yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF": {"config.json": "{}", "model.safetensors": "llm"},
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
        {"uri": "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF", "into": "llm"},
        {"uri": "hf://yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX", "into": ""},
    ]
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
