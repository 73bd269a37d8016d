#!/usr/bin/env bash
# The project's three images, built or pushed with whichever of docker, podman or buildah is on
# PATH (`make images`, `make push`; docs/operations/images-and-releases.md).
#
#   scripts/images.sh build|push|list
#
# Settings (environment; empty means the default):
#   REGISTRY  where the images are named, without a trailing "/"   [ghcr.io/cosyvoice-operator]
#   TAG       the operator image's tag; the GPU images get TAG-trtllmTRTLLM
#                                                 [appVersion of charts/cosyvoice-operator]
#   TRTLLM    the TensorRT-LLM version of the GPU images' base    [0.20.0, engine-builder/Dockerfile]
#   IMAGES    which images, space- or comma-separated            [operator engine-builder serving]
#   BUILDER   docker, podman or buildah                          [the first of them on PATH]
#   PLATFORM  passed as --platform to every build (e.g. linux/amd64)               [none]
#
# With the defaults the names are the ones the chart and the operator use by default, so
# `--set imageRegistry=REGISTRY` points an install at what this built. Every image is built
# from the repository root (the GPU images copy packages from beside their own folder).
# `list` prints "NAME IMAGE DOCKERFILE" per image and needs no builder.
set -euo pipefail

here="${BASH_SOURCE[0]}"
[[ "$here" == */* ]] && here="${here%/*}" || here=.
root="$(cd "$here/.." && pwd)"
action="${1:-}"
case "$action" in
  build | push | list) ;;
  *)
    echo "usage: scripts/images.sh build|push|list (make images / make push)" >&2
    exit 2
    ;;
esac

fail() {
  echo "error: $*" >&2
  exit 2
}

registry="${REGISTRY:-ghcr.io/cosyvoice-operator}"
registry="${registry%/}"
# A registry host (with an optional port) and optional path: lower case, no tag, no digest.
host='[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?'
path='[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*'
if [[ ! "$registry" =~ ^${host}(/${path})*$ ]]; then
  fail "REGISTRY=\"${REGISTRY:-}\" is not a registry and path such as registry.example.com/team (lower case, no tag or digest)"
fi

tag="${TAG:-}"
if [ -z "$tag" ]; then
  while IFS= read -r line; do
    if [[ "$line" =~ ^appVersion:[[:space:]]*\"?([^\"[:space:]]+)\"? ]]; then
      tag="${BASH_REMATCH[1]}"
    fi
  done <"$root/charts/cosyvoice-operator/Chart.yaml"
  [ -n "$tag" ] || fail "no appVersion in charts/cosyvoice-operator/Chart.yaml: set TAG"
fi
trtllm="${TRTLLM:-0.20.0}"
for value in "$tag" "$tag-trtllm$trtllm"; do
  if [[ ! "$value" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; then
    fail "\"$value\" is not an image tag (letters, digits, '_', '.', '-'; at most 128)"
  fi
done

# name|image|Dockerfile, in the order they are built.
declare -A known=(
  [operator]="operator|$registry/cosyvoice-operator:$tag|Dockerfile"
  [engine-builder]="engine-builder|$registry/engine-builder:$tag-trtllm$trtllm|engine-builder/Dockerfile"
  [serving]="serving|$registry/cosyvoice-triton:$tag-trtllm$trtllm|serving-image/Dockerfile"
)
selected=()
for name in ${IMAGES:-operator engine-builder serving}; do
  for one in ${name//,/ }; do
    [ -n "${known[$one]:-}" ] || fail "IMAGES: unknown image \"$one\" (operator, engine-builder, serving)"
    selected+=("${known[$one]}")
  done
done

if [ "$action" = list ]; then
  for entry in "${selected[@]}"; do
    IFS='|' read -r name image dockerfile <<<"$entry"
    echo "$name $image $dockerfile"
  done
  exit 0
fi

# docker is a client: it is usable only with a daemon it can reach; podman and buildah need none.
usable() {
  command -v "$1" >/dev/null || return 1
  [ "$1" != docker ] || docker info >/dev/null 2>&1
}
target="make $([ "$action" = build ] && echo images || echo push)"
builder="${BUILDER:-}"
if [ -n "$builder" ]; then
  case "$builder" in docker | podman | buildah) ;; *) fail "BUILDER=$builder: one of docker, podman, buildah" ;; esac
  command -v "$builder" >/dev/null || fail "BUILDER=$builder is not on PATH"
  usable "$builder" || fail "BUILDER=docker: docker is on PATH but reaches no Docker daemon ('docker info' fails): start one, or use podman or buildah"
else
  for candidate in docker podman buildah; do
    if usable "$candidate"; then
      builder="$candidate"
      break
    fi
  done
  if [ -z "$builder" ]; then
    echo "error: '$target' needs a container image builder: docker (with a running Docker daemon), podman or buildah; none is usable here." >&2
    if command -v docker >/dev/null; then
      echo "docker is on PATH ($(command -v docker)), but 'docker info' fails: no Docker daemon is reachable." >&2
    else
      echo "None of docker, podman, buildah is on PATH." >&2
    fi
    echo "Install one (Docker Engine, podman or buildah), or build on a machine that has one; the GPU images start from nvcr.io/nvidia/tritonserver, so it must also reach nvcr.io." >&2
    exit 127
  fi
fi

for entry in "${selected[@]}"; do
  IFS='|' read -r name image dockerfile <<<"$entry"
  if [ "$action" = build ]; then
    args=(build -f "$dockerfile" -t "$image")
    [ -z "${PLATFORM:-}" ] || args+=(--platform "$PLATFORM")
    echo "== $name: $builder ${args[*]} ." >&2
    (cd "$root" && "$builder" "${args[@]}" .)
  else
    echo "== $name: $builder push $image" >&2
    "$builder" push "$image"
  fi
done
