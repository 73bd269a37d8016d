"""The ``cosyvoice-operator`` command: run the operator, manage the local cluster, run the demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from cosyvoice_operator import __version__


def _cmd_run(args: argparse.Namespace) -> int:
    import kopf

    from cosyvoice_operator.shell.config import ConfigError

    try:
        from cosyvoice_operator.shell import (
            kopf_hooks,  # registers the handlers with kopf; reads the configuration
        )
    except ConfigError as exc:
        print(f"error: bad operator setting: {exc}", file=sys.stderr)
        return 2

    from cosyvoice_operator.plan.peering import random_priority

    problem = _preflight()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    namespaces = args.namespace or []
    kopf_hooks.SERVED_NAMESPACES = tuple(namespaces)
    priority = None
    if args.peering is not None:
        # Replicas of one Deployment share their arguments; equal priorities would make
        # kopf pause them all. A random one per process makes the highest the active one.
        priority = args.priority if args.priority is not None else random_priority()
        kopf_hooks.PEERING = (args.peering, priority)
    if args.metrics_port is not None:
        from cosyvoice_operator.shell.metrics import serve

        try:
            serve(args.metrics_port, args.metrics_address)
        except OSError as exc:
            print(
                f"error: cannot serve metrics on {args.metrics_address}:{args.metrics_port}: "
                f"{exc.strerror}",
                file=sys.stderr,
            )
            return 1
    from cosyvoice_operator.shell.logs import configure

    configure(args.log_format, args.verbose)
    if priority is not None:
        logging.getLogger(__name__).info("peering %r with priority %d", args.peering, priority)
    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=priority,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0


def _preflight() -> str | None:
    """Load the credentials and reach the API server once, before kopf starts: a bad
    kubeconfig or an API server that does not answer is one line and an exit, not a
    traceback a minute."""
    import asyncio

    from cosyvoice_operator.shell.kube import ConnectError, Kube

    async def check() -> None:
        kube = await Kube.connect(attempts=int(os.environ.get("COSYVOICE_CONNECT_ATTEMPTS", "5")))
        await kube.close()

    try:
        asyncio.run(check())
    except ConnectError as exc:
        return str(exc)
    return None


def _cluster(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from cosyvoice_operator.devtools.localcluster import LocalCluster

    return LocalCluster(args.name)


def _cmd_cluster(args: argparse.Namespace) -> int:
    from cosyvoice_operator.devtools.localcluster import ClusterError, parse_gpu_nodes
    from cosyvoice_operator.devtools.localcluster.binaries import BuildError

    cluster = _cluster(args)
    try:
        if args.action == "up":
            gpu_nodes = parse_gpu_nodes(args.gpu_nodes) if args.gpu_nodes else None
            cluster.up(gpu_nodes=gpu_nodes, gpus_per_node=args.gpus_per_node)
            sys.stdout.write(cluster.exports())
        elif args.action == "down":
            cluster.down(wipe=args.wipe)
            print(f"cluster {args.name!r} stopped", file=sys.stderr)
        elif args.action == "status":
            status = cluster.status()
            print(json.dumps(status, indent=2))
            return 0 if cluster.is_up() else 3
        elif args.action == "build":
            from cosyvoice_operator.devtools.localcluster.binaries import ensure_all

            for name, path in ensure_all().items():
                print(f"{name}: {path}", file=sys.stderr)
        elif args.action == "env":
            sys.stdout.write(cluster.exports())
    except (ClusterError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from cosyvoice_operator.devtools import demo

    return demo.main(
        args.name,
        keep_state=args.keep_state,
        keep_cluster=args.keep_cluster,
        closed_loop=not args.no_load,
        cycles=args.cycles,
        timeout=args.timeout,
    )


def _cmd_render(args: argparse.Namespace) -> int:
    from cosyvoice_operator.cli.render_command import (
        RenderError,
        load_service,
        render_service,
        to_yaml,
    )
    from cosyvoice_operator.shell.config import ConfigError, load

    try:
        cfg = load()
    except ConfigError as exc:
        print(f"error: bad operator setting: {exc}", file=sys.stderr)
        return 2
    source = "<stdin>" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as exc:
        print(f"error: cannot read {source}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        body = load_service(text, source)
        objects = render_service(body, args.gpu_product or [], cfg, args.namespace or "")
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(objects))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cosyvoice-operator",
        description="Run CosyVoice text-to-speech fleets on Kubernetes GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_cluster(sub)
    _add_render(sub)
    _add_demo(sub)
    from cosyvoice_operator.devtools.sim import (
        command as sim_command,  # the autoscaling benchmark (issue 10)
    )

    sim_command.add_parser(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the operator against the current kubeconfig")
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        help="namespace to serve (repeatable); all namespaces when none is given",
    )
    run.add_argument("--peering", help="kopf peering name, for more than one operator replica")
    run.add_argument(
        "--priority",
        type=int,
        help="peering priority (the highest live one is active); default: random per process",
    )
    run.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve the operator's Prometheus metrics on this port (/metrics)",
    )
    run.add_argument("--metrics-address", default="0.0.0.0", help="address of the metrics endpoint")
    run.add_argument("--verbose", action="store_true")
    run.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text lines, or one JSON object per line for log pipelines",
    )
    run.set_defaults(func=_cmd_run)


def _add_cluster(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = sub.add_parser(
        "cluster",
        help="a local Kubernetes cluster of real components with fake GPU nodes",
        description=(
            "Manage a local cluster: real etcd, kube-apiserver, controller-manager and scheduler "
            'built from the Go module proxy, and kwok GPU nodes. `eval "$(cosyvoice-operator '
            'cluster up)"` points kubectl and helm at it.'
        ),
    )
    cluster.add_argument("action", choices=["up", "down", "status", "env", "build"])
    cluster.add_argument("--name", default="cosyvoice", help="cluster name (several may run)")
    cluster.add_argument(
        "--gpu-nodes",
        action="append",
        metavar="PRODUCT=COUNT",
        help="fake GPU nodes by nvidia.com/gpu.product (repeatable); "
        "default NVIDIA-L20=2 and NVIDIA-H100-80GB-HBM3=2",
    )
    cluster.add_argument("--gpus-per-node", type=int, default=8, help="nvidia.com/gpu per node")
    cluster.add_argument("--wipe", action="store_true", help="with down: delete its data too")
    cluster.set_defaults(func=_cmd_cluster)


def _add_render(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    render = sub.add_parser(
        "render",
        help="print every object the operator would create for a service (no cluster needed)",
    )
    render.add_argument("-f", "--file", required=True, help="a CosyVoiceService manifest, or -")
    render.add_argument(
        "--gpu-product",
        action="append",
        metavar="PRODUCT",
        help="GPU product to render for (repeatable), e.g. NVIDIA-L20; "
        "default spec.engine.gpuProducts",
    )
    render.add_argument("-n", "--namespace", help="namespace (default: the manifest's, or default)")
    render.set_defaults(func=_cmd_render)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="local cluster + operator + the examples, the autoscaler in a closed loop",
        description=(
            "Start a local cluster, the CRD, the operator and the examples; give every Ready "
            "pod of the autoscaled example a real CPU tritonserver scraped by a real "
            "Prometheus, send a load that rises and falls, and show the replicas following "
            "it. Starts from an empty cluster unless --keep-state."
        ),
    )
    demo.add_argument("--name", default="cosyvoice-demo", help="the local cluster's name")
    demo.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    demo.add_argument(
        "--keep-state",
        action="store_true",
        help="reuse the last run's cluster data (services, engines, Events) instead of a clean one",
    )
    demo.add_argument(
        "--no-load",
        action="store_true",
        help="no Prometheus, Tritons or load (the autoscaler then holds: no metrics)",
    )
    demo.add_argument(
        "--cycles",
        type=int,
        metavar="N",
        help="stop after N rises and falls of the load that each scaled up and back down",
    )
    demo.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="give up (exit 1) after this long"
    )
    demo.set_defaults(func=_cmd_demo)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result
