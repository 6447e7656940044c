#!/usr/bin/env python3
"""The workspace's layering, checked from `cargo metadata` (ARCHITECTURE.md, "Layers").

A crate's normal (non-dev) dependencies on workspace crates may only go to a lower layer, and
rondo-client (the published library) may depend on no workspace crate but rondo-core and
rondo-clock (both published with it). A new
workspace crate must be given a layer here. Exits 1 naming every edge that breaks the rule.
"""
import json
import subprocess
import sys

LAYERS = {
    "rondo-core": 0,
    # The one clock mapping (std instants onto the core's scale), for every balancing point.
    "rondo-clock": 1,
    "rondo-config": 1,
    "rondo-client": 2,
    "rondo-runtime": 2,
    "rondo-proxy": 3,
    "rondo-agent": 3,
    "rondo-naming": 3,
    "rondo-lab": 3,
    "rondo-admin": 3,
    # Durable queues: intake, stores (embedded redb, NATS JetStream), delivery. Above the
    # router, whose route stage (sign-on tokens) a queue listener shares.
    "rondo-queue": 4,
    "rondo": 5,
    # Tools over everything: benchmarks and golden vectors.
    "rondo-bench": 6,
    "rondo-golden": 6,
}
CLIENT_MAY_USE = {"rondo-core", "rondo-clock"}


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
            if name == "rondo-client" and dep not in CLIENT_MAY_USE:
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
