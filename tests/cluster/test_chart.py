"""The Helm chart: it lints and renders, it installs and uninstalls on a real control plane, its
RBAC is both enough and no more than enough, and its image allowlist is enforced by the API
server.

Enough is shown for real: there is no kubelet here (kwok plays the pods), so the operator runs
as a local process that authenticates with a token of the chart's ServiceAccount, and must take
a service to EngineReady without a single Forbidden. No more than enough: the rendered rules
are compared with the list of calls the operator makes, the API server's own account of what
the ServiceAccount may do (a SelfSubjectRulesReview) is compared with the same list, and
`kubectl auth can-i --as` checks what it may and may not do (never a Secret, never a pod
created).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart_tools import (
    CHART,
    CLUSTER_RULES,
    DEFAULT_PREFIXES,
    L20,
    NAMESPACED_RULES,
    NAMESPACES_RULE,
    Release,
    Rule,
    exists,
    install,
    run_helm,
    uninstall,
)
from tests.cluster.operator_process import OperatorProcess, cache_claim, get_json, wait_for
from tests.conftest import REPO, Cluster

REGISTRY = "registry.example.com/tts"


def owned_by_release(cluster: Cluster, release: Release) -> list[str]:
    """What is left in the release's namespace of its Deployment: ReplicaSets and pods."""
    found = cluster.kubectl(
        "get",
        "replicasets,pods",
        "-n",
        release.namespace,
        "-l",
        f"app.kubernetes.io/instance={release.name}",
        "-o",
        "name",
    )
    return found.stdout.split()


@pytest.mark.cluster
def test_the_packaged_chart_installs_serves_upgrades_and_uninstalls_cleanly(
    cluster: Cluster, helm: Path, tmp_path: Path
) -> None:
    """Issue 33, item 4: `helm install` of the packaged chart (what the release pushes as an OCI
    artifact; here the same `helm package` file) with every image under one registry
    (`imageRegistry`), the example service applied, its objects checked on the API server,
    `helm upgrade`, and `helm uninstall` leaving nothing but the CRD (and the users' services)."""
    run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    package = tmp_path / "cosyvoice-operator-0.1.0.tgz"
    served = cluster.namespace("chart-svc")
    release = install(
        cluster,
        helm,
        f"imageRegistry={json.dumps(REGISTRY)}",
        f'imagePolicy={{"allowedPrefixes":["{REGISTRY}/"]}}',
        f"watchNamespaces={json.dumps([served])}",
        chart=package,
    )
    full = release.service_account
    op: OperatorProcess | None = None
    try:
        manifest = run_helm(
            helm, "get", "manifest", release.name, "-n", release.namespace, env=cluster.env
        ).stdout
        created = [
            (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
            for d in yaml.safe_load_all(manifest)
            if d
        ]
        kinds = {kind for kind, _, _ in created}
        assert {
            "ServiceAccount",
            "Deployment",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        } <= kinds, kinds
        for kind, name, namespace in created:
            where = ["-n", namespace] if namespace else []
            assert exists(cluster, kind.lower(), name, *where), f"{kind} {name} was not created"
        listed = run_helm(helm, "list", "-n", release.namespace, "-o", "json", env=cluster.env)
        [entry] = json.loads(listed.stdout)
        assert entry["status"] == "deployed" and entry["app_version"] == "0.1.0"

        # The operator's own image, as the API server holds it.
        deployment = get_json(cluster, "deployment", full, "-n", release.namespace)
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{REGISTRY}/cosyvoice-operator:0.1.0"
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert env["COSYVOICE_IMAGE_REGISTRY"] == REGISTRY
        notes = run_helm(
            helm, "get", "notes", release.name, "-n", release.namespace, env=cluster.env
        ).stdout
        assert f"The image is {REGISTRY}/cosyvoice-operator:0.1.0." in notes, notes

        # The operator, with the installed Deployment's settings and its ServiceAccount's token
        # (kwok plays pods: it cannot run the container), serving the example: the API server's
        # policy on what that ServiceAccount creates admits only allowed images.
        kubeconfig = service_account_kubeconfig(cluster, release, tmp_path / "kubeconfig")
        cluster.apply(served, cache_claim())
        op = OperatorProcess(cluster, served, tmp_path, KUBECONFIG=str(kubeconfig), **env).start()
        cluster.apply(served, (REPO / "examples" / "cosyvoice2.yaml").read_text())

        def workloads(kind: str, count: int) -> dict[str, list[str]] | None:
            items = get_json(cluster, kind, "-n", served)["items"]
            found = {
                o["metadata"]["name"]: [
                    c["image"] for c in o["spec"]["template"]["spec"]["containers"]
                ]
                for o in items
            }
            return found if len(found) >= count else None

        try:
            # One build Job per GPU architecture of the test nodes (L20: sm_89, H100: sm_90),
            # then one serving Deployment per architecture once its engine is Ready.
            jobs = wait_for("the example's build Jobs", lambda: workloads("jobs", 2), timeout=90)
            deployments = wait_for(
                "the example's serving Deployments",
                lambda: workloads("deployments", 2),
                timeout=120,
            )
        except AssertionError as exc:
            status = get_json(cluster, "cvs", "cosyvoice2", "-n", served).get("status")
            raise AssertionError(
                f"{exc}\nstatus: {json.dumps(status)}\noperator log:\n{op.log()}"
            ) from None
        assert {i for images in jobs.values() for i in images} == {
            f"{REGISTRY}/engine-builder:0.1.0-trtllm0.20.0"
        }, jobs
        assert {i for images in deployments.values() for i in images} == {
            f"{REGISTRY}/cosyvoice-triton:0.1.0-trtllm0.20.0",
            f"{REGISTRY}/haproxy:3.2",  # the router's (issue 30), moved by imageRegistry too
        }, deployments
        op.stop()
        bad = [line for line in op.log(whole=True).splitlines() if FORBIDDEN.search(line)]
        assert not bad, "the operator was refused something:\n" + "\n".join(bad[:20])

        # An upgrade of the same package with a value changed: a new revision, the Deployment
        # rolled to it (its controller observed the new generation), the images unchanged.
        run_helm(
            helm,
            "upgrade",
            release.name,
            str(package),
            "-n",
            release.namespace,
            "--reuse-values",
            "--set",
            "logFormat=json",
            env=cluster.env,
        )
        [entry] = json.loads(
            run_helm(helm, "list", "-n", release.namespace, "-o", "json", env=cluster.env).stdout
        )
        assert (entry["status"], entry["revision"]) == ("deployed", "2"), entry

        def rolled() -> dict[str, Any] | None:
            d: dict[str, Any] = get_json(cluster, "deployment", full, "-n", release.namespace)
            generation = d["metadata"]["generation"]
            new = generation > deployment["metadata"]["generation"]
            return d if new and d["status"].get("observedGeneration") == generation else None

        upgraded = wait_for("the upgraded Deployment observed", rolled, timeout=60)
        [container] = upgraded["spec"]["template"]["spec"]["containers"]
        assert container["args"][-2:] == ["--log-format", "json"], container["args"]
        assert container["image"] == f"{REGISTRY}/cosyvoice-operator:0.1.0"

        # Uninstall: every object of the release gone, and its Deployment's ReplicaSets and
        # pods after it; the CRD stays (Helm never deletes CRDs), and so do users' services.
        run_helm(
            helm, "uninstall", release.name, "-n", release.namespace, "--wait", env=cluster.env
        )
        for kind, name, namespace in created:
            where = ["-n", namespace] if namespace else []
            assert not exists(cluster, kind.lower(), name, *where), f"{kind} {name} is left"
        wait_for(
            "the release's ReplicaSets and pods gone",
            lambda: not owned_by_release(cluster, release) or None,
            timeout=60,
        )
        assert (
            run_helm(helm, "list", "-n", release.namespace, "-q", env=cluster.env).stdout.strip()
            == ""
        )
        assert exists(cluster, "crd", "cosyvoiceservices.tts.cosyvoice.dev")
        assert exists(cluster, "cvs", "cosyvoice2", "-n", served)
    finally:
        if op is not None:
            op.stop()
        run_helm(
            helm, "uninstall", release.name, "-n", release.namespace, env=cluster.env, check=False
        )
        # The service goes now (no finalizer): the cluster-wide tests below want none left.
        cluster.kubectl("delete", "cvs", "--all", "-n", served, "--wait=true", check=False)
        for namespace in (served, release.namespace):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def service_account_kubeconfig(cluster: Cluster, release: Release, path: Path) -> Path:
    """A kubeconfig of the same server and CA as the admin's, authenticating as the chart's SA."""
    token = cluster.kubectl(
        "create", "token", release.service_account, "-n", release.namespace, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    [server] = admin["clusters"]
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": server["name"], "user": user}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


FORBIDDEN = re.compile(r"Forbidden|forbidden|\b403\b|Not enough permissions")


class ClusterwideOperator(OperatorProcess):
    """`cosyvoice-operator run` with no --namespace, as the chart runs it by default: kopf
    watches services across the cluster."""

    def start(self, liveness_port: int | None = None) -> ClusterwideOperator:
        assert liveness_port is None, "not used here"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cosyvoice_operator", "run"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self


@pytest.fixture(scope="module")
def clusterwide_release(cluster: Cluster, helm: Path) -> Iterator[Release]:
    # Without the image policy: it is cluster-scoped and would stay for the whole module, and
    # the API server names only one refusing policy, so the image tests could not tell theirs.
    release = install(cluster, helm, 'imagePolicy={"enabled":false}')
    yield release
    uninstall(cluster, helm, release)


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_the_operator_builds_an_engine_with_only_the_charts_permissions(
    cluster: Cluster, helm: Path, tmp_path: Path, mode: str
) -> None:
    served = cluster.namespace("chart-svc")
    if mode == "clusterwide":
        release = install(cluster, helm)
    else:
        release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
        assert exists(cluster, "role", release.service_account, "-n", served)
    kubeconfig = service_account_kubeconfig(cluster, release, tmp_path / "kubeconfig")
    whoami = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{release.namespace}:{release.service_account}"
    )
    # A build touches every granted kind: the cache claim, nodes, the Job and its pods, and the
    # services themselves (the informers' list and watch), the record ConfigMap (create, patch),
    # the Job (create), Events (create) and the status subresource (patch). The credentials
    # Secret is for the build pod (envFrom): the operator never reads it, and may not.
    cluster.apply(served, cache_claim())
    cluster.kubectl(
        "create", "secret", "generic", "hf-token", "-n", served, "--from-literal=HF_TOKEN=x"
    )
    operator = ClusterwideOperator if mode == "clusterwide" else OperatorProcess
    if mode == "clusterwide":
        # A cluster-wide operator acts on every service of the cluster; another test's would
        # make this one's log (and that test) a mix of two operators.
        others = get_json(cluster, "cvs", "-A")["items"]
        assert not others, "services left by other tests: " + ", ".join(
            f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in others
        )
    op = operator(cluster, served, tmp_path, KUBECONFIG=str(kubeconfig)).start()
    try:
        body = {
            "apiVersion": "tts.cosyvoice.dev/v1alpha1",
            "kind": "CosyVoiceService",
            "metadata": {"name": "rbac"},
            "spec": {
                "model": {
                    "variant": "cosyvoice3",
                    "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                    "credentialsSecret": "hf-token",
                },
                "serving": {"nodeSelector": L20},
            },
        }
        cluster.apply(served, json.dumps(body))

        def ready() -> dict[str, Any] | None:
            obj: dict[str, Any] = get_json(cluster, "cvs", "rbac", "-n", served)
            return obj if condition(obj, "EngineReady").get("status") == "True" else None

        try:
            obj = wait_for("EngineReady under the chart's ServiceAccount", ready, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{op.log()}") from None
        [entry] = obj["status"]["engines"]
        records = get_json(
            cluster, "configmap", "-n", served, "-l", f"tts.cosyvoice.dev/engine-key={entry['key']}"
        )
        assert len(records["items"]) == 1, "the engine record ConfigMap was not created"
        # A build that just works posts no Event (issue 18, item 7); a problem does: a service
        # naming a cache claim that does not exist, for the chart's Event permission.
        blocked = json.loads(json.dumps(body))
        blocked["metadata"]["name"] = "rbac-blocked"
        blocked["spec"]["engine"] = {"cacheClaimName": "no-such-claim"}
        cluster.apply(served, json.dumps(blocked))

        def warned() -> set[str] | None:
            events = get_json(cluster, "events", "-n", served)["items"]
            found = {e["reason"] for e in events if e["involvedObject"]["name"] == "rbac-blocked"}
            return found if "CacheClaimMissing" in found else None

        wait_for("the operator's Warning Event", warned, timeout=60)
        # A permission only a later pass needs (the record, the Events) has been used by now;
        # the condition stays as it is.
        obj = get_json(cluster, "cvs", "rbac", "-n", served)
        assert condition(obj, "EngineReady").get("status") == "True", obj.get("status")
        # No finalizer (no kopf timers, no deletion handler): deletion never waits on the
        # operator, and the operator sees the deletion through without being refused anything.
        assert not obj["metadata"].get("finalizers"), obj["metadata"].get("finalizers")
        cluster.kubectl("delete", "cvs", "rbac", "rbac-blocked", "-n", served, "--timeout=30s")
        assert not exists(cluster, "cvs", "rbac", "-n", served)
    finally:
        op.stop()
        uninstall(cluster, helm, release)
        cluster.kubectl("delete", "namespace", served, "--wait=false", check=False)
    log = op.log_path.read_text(errors="replace")
    bad = [line for line in log.splitlines() if FORBIDDEN.search(line)]
    assert not bad, "the operator was refused something:\n" + "\n".join(bad[:20])


def can_i(cluster: Cluster, release: Release, *what: str) -> bool:
    who = f"--as=system:serviceaccount:{release.namespace}:{release.service_account}"
    proc = cluster.kubectl("auth", "can-i", *what, who, check=False)
    return proc.stdout.strip() == "yes"


Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def grants(rules: set[Rule]) -> set[Grant]:
    return {(group, resource, verb) for group, resource, verbs in rules for verb in verbs}


# What every authenticated user may do (system:basic-user): ask what it may do, and who it is.
SELF_REVIEWS = {"authorization.k8s.io", "authentication.k8s.io"}


def granted(cluster: Cluster, release: Release, namespace: str) -> set[Grant]:
    """The API server's own account (a SelfSubjectRulesReview, made as the ServiceAccount with
    its groups) of what the ServiceAccount may do in `namespace`, cluster-wide grants included,
    less the self-reviews every authenticated user may make."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    proc = cluster.kubectl(
        "create",
        "-f",
        "-",
        "-o",
        "json",
        f"--as=system:serviceaccount:{release.namespace}:{release.service_account}",
        "--as-group=system:serviceaccounts",
        f"--as-group=system:serviceaccounts:{release.namespace}",
        "--as-group=system:authenticated",
        input=json.dumps(review),
    )
    status = json.loads(proc.stdout)["status"]
    assert not status.get("incomplete"), status
    found: set[Grant] = set()
    for rule in status.get("resourceRules", []):
        assert not rule.get("resourceNames"), rule
        for group in rule.get("apiGroups", []):
            if group in SELF_REVIEWS:
                continue
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    found.add((group, resource, verb))
    return found


def qualified(group: str, resource: str) -> list[str]:
    """`kubectl auth can-i` arguments for a resource, a subresource asked for with
    --subresource (what follows a slash would be read as an object's name)."""
    kind, _, sub = resource.partition("/")
    return [f"{kind}.{group}" if group else kind, *([f"--subresource={sub}"] if sub else [])]


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("verb", "resource", "scope", "allowed"),
    [
        # what it needs
        ("watch", "cosyvoiceservices.tts.cosyvoice.dev", "-A", True),
        ("list", "cosyvoiceservices.tts.cosyvoice.dev", "-A", True),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev/status", "-n=default", True),
        ("create", "jobs.batch", "-n=default", True),
        ("list", "jobs.batch", "-A", True),
        ("watch", "jobs.batch", "-A", True),
        ("delete", "jobs.batch", "-n=default", True),
        ("list", "pods", "-A", True),
        ("watch", "pods", "-A", True),
        ("list", "configmaps", "-A", True),
        ("watch", "configmaps", "-A", True),
        ("create", "configmaps", "-n=default", True),
        ("patch", "configmaps", "-n=default", True),
        ("delete", "configmaps", "-n=default", True),
        ("list", "persistentvolumeclaims", "-A", True),
        ("watch", "persistentvolumeclaims", "-A", True),
        ("list", "nodes", "", True),
        ("watch", "nodes", "", True),
        ("create", "events", "-n=default", True),
        ("list", "deployments.apps", "-A", True),
        ("patch", "deployments.apps", "-n=default", True),
        ("delete", "deployments.apps", "-n=default", True),
        ("patch", "services", "-n=default", True),
        ("patch", "poddisruptionbudgets.policy", "-n=default", True),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", "", True),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", "", True),
        # what it must not do: no get of anything (informers only), no Secret at all, no pod
        # created, nothing updated, nothing else deleted or patched
        ("get", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("update", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("delete", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("create", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("update", "cosyvoiceservices.tts.cosyvoice.dev/status", "-n=default", False),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev/scale", "-n=default", False),
        ("get", "secrets", "-n=default", False),
        ("list", "secrets", "-A", False),
        ("watch", "secrets", "-A", False),
        ("create", "secrets", "-n=default", False),
        ("create", "pods", "-n=default", False),
        ("get", "pods", "-n=default", False),
        ("delete", "pods", "-n=default", False),
        ("create", "pods/exec", "-n=default", False),
        ("get", "pods/log", "-n=default", False),
        ("get", "jobs.batch", "-n=default", False),
        ("patch", "jobs.batch", "-n=default", False),
        ("update", "jobs.batch", "-n=default", False),
        ("get", "configmaps", "-n=default", False),
        ("update", "configmaps", "-n=default", False),
        ("get", "persistentvolumeclaims", "-n=default", False),
        ("create", "persistentvolumeclaims", "-n=default", False),
        ("delete", "persistentvolumeclaims", "-n=default", False),
        ("get", "nodes", "", False),
        ("patch", "nodes", "", False),
        ("delete", "nodes", "", False),
        ("patch", "events", "-n=default", False),
        ("list", "events", "-n=default", False),
        ("create", "events.events.k8s.io", "-n=default", False),
        # (Deployments are created by server-side apply, which needs create: every namespace's
        # with one ClusterRole; the operator's admission policy then refuses any Deployment
        # without its managed-by label, tests/cluster/test_operator_policy.py.)
        ("create", "deployments.apps", "-n=default", True),
        ("create", "services", "-n=default", True),
        ("get", "deployments.apps", "-n=default", False),
        ("update", "deployments.apps", "-n=default", False),
        # the router's objects are deleted when a service leaves mode Router (issue 30), only
        # those with the operator's label (its admission policy)
        ("delete", "services", "-n=default", True),
        ("delete", "poddisruptionbudgets.policy", "-n=default", True),
        ("delete", "networkpolicies.networking.k8s.io", "-n=default", True),
        ("patch", "deployments.apps/scale", "-n=default", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", False),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", "", False),
        ("impersonate", "serviceaccounts", "-A", False),
        ("create", "serviceaccounts/token", "-A", False),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io", "", False),
        ("get", "customresourcedefinitions.apiextensions.k8s.io", "", False),
        ("delete", "validatingadmissionpolicies.admissionregistration.k8s.io", "", False),
        # serving every namespace, kopf never looks at namespaces
        ("list", "namespaces", "", False),
        ("delete", "namespaces", "", False),
        ("get", "clusterkopfpeerings.kopf.dev", "", False),
    ],
)
def test_the_service_account_can_do_no_more(
    cluster: Cluster,
    clusterwide_release: Release,
    verb: str,
    resource: str,
    scope: str,
    allowed: bool,
) -> None:
    # `can-i VERB TYPE/NAME` reads what follows the slash as an object's name; a subresource
    # has to be asked for with --subresource.
    kind, _, sub = resource.partition("/")
    args = [verb, kind, *([f"--subresource={sub}"] if sub else []), *([scope] if scope else [])]
    assert can_i(cluster, clusterwide_release, *args) is allowed, (
        f"can-i {' '.join(args)} should be {'yes' if allowed else 'no'}"
    )


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_the_service_account_reads_no_secret_and_creates_no_pod_anywhere(
    cluster: Cluster, helm: Path, mode: str
) -> None:
    """Never a Secret (get, list or watch) and never a pod created, in any namespace or
    cluster-wide; and, by the API server's own account, exactly the listed verbs where it
    serves and only the cluster-scoped ones elsewhere."""
    served = cluster.namespace("chart-svc")
    other = cluster.namespace("chart-other")
    if mode == "clusterwide":
        release = install(cluster, helm)
        serving = {served, other}
    else:
        release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
        serving = {served}
    cluster_rules = CLUSTER_RULES | ({NAMESPACES_RULE} if mode == "namespaced" else set())
    try:
        scopes = [
            "-A",
            *(f"-n={ns}" for ns in ("default", "kube-system", release.namespace, served, other)),
        ]
        for scope in scopes:
            for verb in ("get", "list", "watch"):
                assert not can_i(cluster, release, verb, "secrets", scope), (verb, scope)
            assert not can_i(cluster, release, "create", "pods", scope), scope
        # Exactly the listed verbs, each one asked for on its own...
        for group, resource, verb in sorted(grants(NAMESPACED_RULES)):
            what = qualified(group, resource)
            for ns in (served, other):
                assert can_i(cluster, release, verb, *what, f"-n={ns}") is (ns in serving), (
                    f"can-i {verb} {' '.join(what)} -n {ns}"
                )
            if verb in ("list", "watch"):
                assert can_i(cluster, release, verb, *what, "-A") is (mode == "clusterwide")
        for group, resource, verb in sorted(grants(cluster_rules)):
            assert can_i(cluster, release, verb, *qualified(group, resource)), (verb, resource)
        # ... and all together, as the API server sums up every binding of the ServiceAccount.
        for ns in (served, other, "default"):
            expected = grants(cluster_rules)
            if ns in serving or mode == "clusterwide":
                expected |= grants(NAMESPACED_RULES)
            assert granted(cluster, release, ns) == expected, ns
    finally:
        uninstall(cluster, helm, release)
        for ns in (served, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.cluster
def test_namespaced_install_grants_nothing_outside_its_namespaces(
    cluster: Cluster, helm: Path
) -> None:
    served = cluster.namespace("chart-svc")
    other = cluster.namespace("chart-other")
    release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
    try:
        assert can_i(cluster, release, "create", "jobs.batch", f"-n={served}")
        assert can_i(
            cluster, release, "watch", "cosyvoiceservices.tts.cosyvoice.dev", f"-n={served}"
        )
        assert can_i(cluster, release, "list", "nodes")
        # kopf follows the named namespaces it serves.
        assert can_i(cluster, release, "watch", "namespaces")
        assert not can_i(cluster, release, "create", "jobs.batch", f"-n={other}")
        assert not can_i(cluster, release, "list", "configmaps", f"-n={other}")
        assert not can_i(cluster, release, "get", "secrets", f"-n={other}")
        assert not can_i(cluster, release, "list", "cosyvoiceservices.tts.cosyvoice.dev", "-A")
        args = get_json(cluster, "deployment", release.service_account, "-n", release.namespace)[
            "spec"
        ]["template"]["spec"]["containers"][0]["args"]
        assert ["--namespace", served] == args[1:3]
    finally:
        uninstall(cluster, helm, release)
        for ns in (served, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---- the image allowlist, enforced by the API server ----------------------------------------

GOOD_BUILDER = "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0"
GOOD_SERVING = "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3"


def image_service(
    name: str, builder_image: str | None = None, serving_image: str | None = None
) -> str:
    spec: dict[str, Any] = {
        "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
    }
    if builder_image is not None:
        spec["engine"] = {"builderImage": builder_image}
    if serving_image is not None:
        spec["serving"] = {"image": serving_image}
    body = {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name},
        "spec": spec,
    }
    return json.dumps(body)


def apply_service(
    cluster: Cluster, namespace: str, manifest: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", *args, input=manifest, check=False)


def policy_name(release: Release) -> str:
    return f"{release.service_account}-images"


def wait_until_enforced(cluster: Cluster, release: Release, namespace: str) -> None:
    """A new ValidatingAdmissionPolicy is enforced once the API server's informers have it:
    ask (server-side dry runs, nothing is stored) until it refuses, bounded."""
    bad = image_service("probe", builder_image="docker.io/attacker/builder:1")

    def refused() -> str | None:
        proc = apply_service(cluster, namespace, bad, "--dry-run=server")
        return proc.stderr if policy_name(release) in proc.stderr else None

    wait_for(f"policy {policy_name(release)} enforced in {namespace}", refused, timeout=60)


def assert_refused(
    cluster: Cluster, release: Release, namespace: str, manifest: str, field: str, image: str
) -> None:
    proc = apply_service(cluster, namespace, manifest)
    assert proc.returncode != 0, f"{field}={image!r} was admitted in {namespace}"
    error = proc.stderr
    assert policy_name(release) in error, error
    assert f'{field} "{image}" is not allowed' in error, error
    for prefix in DEFAULT_PREFIXES:
        assert f'"{prefix}"' in error, error


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_the_api_server_refuses_images_outside_the_allowlist(
    cluster: Cluster, helm: Path, mode: str
) -> None:
    served = cluster.namespace("chart-img")
    other = cluster.namespace("chart-img-other")
    if mode == "clusterwide":
        release = install(cluster, helm)
    else:
        release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
    try:
        wait_until_enforced(cluster, release, served)
        field_b, field_s = "spec.engine.builderImage", "spec.serving.image"
        for image in (
            "docker.io/attacker/builder:1",
            # A look-alike of an allowed prefix: the trailing "/" of the prefix keeps it out.
            "ghcr.io/cosyvoice-operator-evil/engine-builder:1",
            "nvcr.io/nvidia",
        ):
            manifest = image_service("bad-builder", builder_image=image)
            assert_refused(cluster, release, served, manifest, field_b, image)
        assert_refused(
            cluster,
            release,
            served,
            image_service("bad-serving", GOOD_BUILDER, "docker.io/library/tritonserver:1"),
            field_s,
            "docker.io/library/tritonserver:1",
        )
        assert not get_json(cluster, "cvs", "-n", served)["items"], "a refused service was stored"

        # Inside the allowlist, and empty (the operator's defaults), is admitted.
        for name, manifest in (
            ("good", image_service("good", GOOD_BUILDER, GOOD_SERVING)),
            ("empty", image_service("empty", "", "")),
            ("unset", image_service("unset")),
        ):
            proc = apply_service(cluster, served, manifest)
            assert proc.returncode == 0, f"{name}: {proc.stderr}"
        stored = get_json(cluster, "cvs", "good", "-n", served)["spec"]
        assert stored["engine"]["builderImage"] == GOOD_BUILDER
        assert stored["serving"]["image"] == GOOD_SERVING

        # Updates are checked too: the stored service keeps its image.
        assert_refused(
            cluster,
            release,
            served,
            image_service("good", GOOD_BUILDER, "docker.io/library/tritonserver:1"),
            field_s,
            "docker.io/library/tritonserver:1",
        )
        stored = get_json(cluster, "cvs", "good", "-n", served)["spec"]
        assert stored["serving"]["image"] == GOOD_SERVING

        # The binding covers the namespaces the operator serves, and only those.
        bad = image_service("bad-builder", builder_image="docker.io/attacker/builder:1")
        proc = apply_service(cluster, other, bad, "--dry-run=server")
        if mode == "clusterwide":
            assert proc.returncode != 0 and policy_name(release) in proc.stderr, proc.stderr
        else:
            assert policy_name(release) not in proc.stderr, proc.stderr
    finally:
        # Services first (no finalizer: gone at once), so that no test that wants the cluster
        # to itself finds them; then the release, and with it the cluster-wide policy.
        for ns in (served, other):
            cluster.kubectl("delete", "cvs", "--all", "-n", ns, check=False)
        uninstall(cluster, helm, release)
        for ns in (served, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    assert not exists(cluster, "validatingadmissionpolicy", policy_name(release))
    assert not exists(cluster, "validatingadmissionpolicybinding", policy_name(release))
