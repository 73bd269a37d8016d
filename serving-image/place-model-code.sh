#!/bin/sh
# Lays out the serving image's model code: OUT/<variant>/<model>/1/ for every line of LIST
# (serving-image/model-code.list), each from exactly the source the line names, and
# OUT/SOURCES recording it. Nothing unlisted is copied: upstream's other models (the DiT
# variant's cosyvoice2_dit, token2wav_dit) and upstream's code for the models we own stay out.
#
#   place-model-code.sh LIST UPSTREAM_CHECKOUT SERVING_MODELS OUT
#
# Run by serving-image/Dockerfile (upstream stage) and by
# tests/serving_models/test_image_model_code.py on a stand-in checkout.
set -eu

if [ "$#" -ne 4 ]; then
    echo "usage: $0 LIST UPSTREAM_CHECKOUT SERVING_MODELS OUT" >&2
    exit 2
fi
list=$1
upstream=$2
ours=$3
out=$4
mkdir -p "${out}"
: > "${out}/SOURCES"

grep -v '^[[:space:]]*#' "${list}" | while read -r variant model source rest; do
    [ -n "${variant}" ] || continue
    if [ -n "${rest}" ] || [ -z "${source}" ]; then
        echo "${list}: '${variant} ${model} ${source} ${rest}' is not 'variant model source'" >&2
        exit 1
    fi
    case "${variant}" in
        cosyvoice2) repo=model_repo ;;
        cosyvoice3) repo=model_repo_cosyvoice3 ;;
        *) echo "${list}: unknown variant ${variant}" >&2; exit 1 ;;
    esac
    dest="${out}/${variant}/${model}/1"
    if [ -e "${dest}" ]; then
        echo "${list}: ${variant}/${model} is listed twice" >&2
        exit 1
    fi
    mkdir -p "${dest}"
    case "${source}" in
        ours)
            from="${ours}/models/${model}/model.py"
            if [ ! -f "${from}" ]; then
                echo "${variant}/${model}: ${from} does not exist" >&2
                exit 1
            fi
            cp "${from}" "${dest}/model.py"
            ;;
        upstream)
            from="${upstream}/runtime/triton_trtllm/${repo}/${model}/1"
            if [ ! -f "${from}/model.py" ]; then
                echo "${variant}/${model}: ${from}/model.py does not exist" >&2
                exit 1
            fi
            cp -R "${from}/." "${dest}/"
            ;;
        backend) ;;
        *)
            echo "${list}: ${variant}/${model}: unknown source ${source}" >&2
            exit 1
            ;;
    esac
    echo "${variant}/${model} ${source}" >> "${out}/SOURCES"
done
