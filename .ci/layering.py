#!/usr/bin/env python3
"""The workspace's layering, checked from `cargo metadata` (ARCHITECTURE.md, "Layers").

A crate's normal (non-dev) dependencies on workspace crates may only go to a lower layer;
rondo-client (the published library) may depend on no workspace crate but rondo-core,
rondo-clock and rondo-tls (all published with it); and a product never depends on another
product (what two products share goes below them, as sign-on went to rondo-identity). A new
workspace crate must be given a layer here. Exits 1 naming every edge that breaks a rule.
"""
import json
import subprocess
import sys

LAYERS = {
    "rondo-core": 0,
    # TLS client plumbing (provider, PEM, connector, failures in words): for the router and the
    # client library alike, so it depends on no crate of ours.
    "rondo-tls": 0,
    # The one clock mapping (std instants onto the core's scale), for every balancing point.
    "rondo-clock": 1,
    "rondo-config": 1,
    "rondo-client": 2,
    "rondo-runtime": 2,
    # Who a request is (sign-on tokens, tier sessions, the identity headers): the router and a
    # queue listener's intake check it alike, so it sits below both.
    "rondo-identity": 3,
    "rondo-proxy": 4,
    "rondo-agent": 4,
    "rondo-naming": 4,
    "rondo-lab": 4,
    "rondo-admin": 4,
    # Durable queues: intake, stores (embedded redb, NATS JetStream), delivery.
    "rondo-queue": 4,
    "rondo": 5,
    # Tools over everything: benchmarks and golden vectors.
    "rondo-bench": 6,
    "rondo-golden": 6,
}
CLIENT_MAY_USE = {"rondo-core", "rondo-clock", "rondo-tls"}
# The products: each is one thing a user runs, and none is built on another (a rule of its own,
# not only of the layers, so that moving a product to another layer cannot hide such an edge).
PRODUCTS = {"rondo-proxy", "rondo-queue", "rondo-naming", "rondo-admin", "rondo-agent"}


def main() -> int:
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            meta = json.load(f)
    else:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
            check=True, capture_output=True, text=True,
        ).stdout
        meta = json.loads(out)
    members = {p["name"] for p in meta["packages"]}
    errors = []
    for p in meta["packages"]:
        name = p["name"]
        if name not in LAYERS:
            errors.append(f"{name}: not in .ci/layering.py's LAYERS; give it a layer")
            continue
        for d in p["dependencies"]:
            dep = d["name"]
            if d["kind"] is not None or dep not in members:
                continue
            if name in PRODUCTS and dep in PRODUCTS:
                errors.append(
                    f"{name} depends on {dep}: a product never depends on another product; "
                    "move what they share below both"
                )
            elif name == "rondo-client" and dep not in CLIENT_MAY_USE:
                errors.append(
                    f"rondo-client depends on {dep}: the client library may use only "
                    "rondo-core and rondo-clock"
                )
            elif LAYERS.get(dep, 99) >= LAYERS[name]:
                errors.append(
                    f"{name} (layer {LAYERS[name]}) depends on {dep} (layer {LAYERS.get(dep, '?')}): "
                    "dependencies must go to a lower layer"
                )
    for e in errors:
        print(e)
    if not errors:
        print(f"ok: {len(meta['packages'])} crates layered")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
