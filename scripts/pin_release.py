"""Write a release into the chart before `helm package` (.github/workflows/release.yml): the
version, and each image by the digest the registry gave it, so that the packaged chart pulls
the very bytes that were built, signed and described by the SBOM.

    python3 scripts/pin_release.py CHART_DIR --version 0.2.0 \\
        --operator ghcr.io/o/cosyvoice-operator@sha256:... \\
        --builder  ghcr.io/o/engine-builder:0.2.0-trtllm0.20.0@sha256:... \\
        --serving  ghcr.io/o/cosyvoice-triton:0.2.0-trtllm0.20.0@sha256:...

Chart.yaml gets version and appVersion; values.yaml gets image.repository and image.digest
(the operator), config.builderImage and config.servingImage (name, tag and digest: the
operator renders them into build Jobs and Deployments). Lines are replaced in place, comments
kept; each must be found exactly once, or nothing is written. Standard library only: it runs on
a bare CI runner.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DIGEST = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")
VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


class PinError(ValueError):
    pass


def _sub_once(text: str, pattern: str, value: str, where: str) -> str:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    if len(found) != 1:
        raise PinError(f"{where}: expected one line matching {pattern!r}, found {len(found)}")
    return re.sub(pattern, lambda m: m.group(1) + value, text, flags=re.MULTILINE)


def _by_digest(image: str, what: str) -> re.Match[str]:
    found = DIGEST.match(image)
    if not found:
        raise PinError(f"--{what} {image!r}: expected NAME[:TAG]@sha256:<64 hex>")
    return found


def pin_chart(chart_yaml: str, version: str) -> str:
    if not VERSION.match(version):
        raise PinError(f"--version {version!r}: expected a semantic version such as 0.2.0")
    text = _sub_once(chart_yaml, r"^(version:[ \t]*).*$", version, "Chart.yaml")
    return _sub_once(text, r"^(appVersion:[ \t]*).*$", f'"{version}"', "Chart.yaml")


def pin_values(values_yaml: str, operator: str, builder: str, serving: str) -> str:
    op = _by_digest(operator, "operator")
    _by_digest(builder, "builder")
    _by_digest(serving, "serving")
    repository = op.group("name")
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]  # the tag goes: the digest names the bytes
    text = values_yaml
    # image: (top level) then its two-space-indented keys; config: likewise.
    text = _sub_once(text, r"^(  repository:[ \t]*)ghcr\.io/.*$", repository, "values.yaml")
    text = _sub_once(text, r'^(  digest:[ \t]*)"".*$', f'"{op.group("digest")}"', "values.yaml")
    text = _sub_once(text, r'^(  builderImage:[ \t]*)"".*$', f'"{builder}"', "values.yaml")
    return _sub_once(text, r'^(  servingImage:[ \t]*)"".*$', f'"{serving}"', "values.yaml")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chart", type=Path)
    parser.add_argument("--version", required=True)
    parser.add_argument("--operator", required=True)
    parser.add_argument("--builder", required=True)
    parser.add_argument("--serving", required=True)
    args = parser.parse_args(argv)
    chart_file, values_file = args.chart / "Chart.yaml", args.chart / "values.yaml"
    try:
        chart = pin_chart(chart_file.read_text(), args.version.removeprefix("v"))
        values = pin_values(values_file.read_text(), args.operator, args.builder, args.serving)
    except PinError as exc:
        print(f"pin_release: {exc}", file=sys.stderr)
        return 2
    chart_file.write_text(chart)
    values_file.write_text(values)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
