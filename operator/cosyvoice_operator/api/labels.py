"""Every label, annotation and app.kubernetes.io value the operator writes or selects by.

Defined once here: the renderers write them, the planners and the shell's caches read them,
and a new key has exactly one home.
"""

from __future__ import annotations

GROUP = "tts.cosyvoice.dev"

# ---- labels ---------------------------------------------------------------------------------

# Build Jobs, engine records and cleanup Jobs: the engine's content key, the tag of the cache
# claim it lives in (a hash of the claim's name and uid), its GPU architecture.
KEY_LABEL = f"{GROUP}/engine-key"
CLAIM_LABEL = f"{GROUP}/cache-claim-hash"
ARCH_LABEL = f"{GROUP}/gpu-arch"
# Build Jobs: which attempt of the engine's build.
ATTEMPT_LABEL = f"{GROUP}/attempt"
# Serving objects and pods: the CosyVoiceService they serve.
SERVICE_LABEL = f"{GROUP}/service"

# ---- annotations ----------------------------------------------------------------------------

# Build Jobs, records and cleanup Jobs: the cache claim by name and uid (the label is a hash).
CLAIM_ANNOTATION = f"{GROUP}/cache-claim"
CLAIM_UID_ANNOTATION = f"{GROUP}/cache-claim-uid"
# Build Jobs (and their pods): the model built, the whole engine identity, the GPU products.
MODEL_URI_ANNOTATION = f"{GROUP}/model-uri"
IDENTITY_ANNOTATION = f"{GROUP}/engine-identity"
GPU_PRODUCTS_ANNOTATION = f"{GROUP}/gpu-products"
# Serving Deployments: the engine key they serve (the same key as KEY_LABEL, as an
# annotation: the pods' selector must not change when the engine does), and the vLLM
# checkpoint a Deployment rendered before vLLM was refused (issue 19 item 9) names: read only,
# so that the cleanup keeps it while such a Deployment exists.
SERVED_KEY_ANNOTATION = f"{GROUP}/engine-key"
CHECKPOINT_ANNOTATION = f"{GROUP}/checkpoint-key"
# Serving objects: the hash of what the operator rendered; pod templates: of the repository.
HASH_ANNOTATION = f"{GROUP}/applied-hash"
REPO_HASH_ANNOTATION = f"{GROUP}/repository-hash"
# Engine records: the cleanup's marks (plan/cleanup.py).
REMOVING_ANNOTATION = f"{GROUP}/removing"
UNREFERENCED_ANNOTATION = f"{GROUP}/unreferenced-since"

# ---- app.kubernetes.io ----------------------------------------------------------------------

NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

MANAGER = "cosyvoice-operator"
# The label selector of everything the operator made (its informers watch only these).
MANAGED = f"{MANAGED_BY_LABEL}={MANAGER}"

ENGINE_NAME = "cosyvoice-engine"
BUILD_COMPONENT = "engine-build"
CLEANUP_COMPONENT = "engine-cleanup"
SERVING_NAME = "cosyvoice-triton"
SERVING_COMPONENT = "serving"
# The router of a service (issue 30): its Deployment, pods and objects carry the service's
# labels with this component.
ROUTER_COMPONENT = "router"

# Build Jobs and engine records (cleanup Jobs replace the component with CLEANUP_COMPONENT).
COMPONENT_LABELS = {
    NAME_LABEL: ENGINE_NAME,
    COMPONENT_LABEL: BUILD_COMPONENT,
    MANAGED_BY_LABEL: MANAGER,
}
