#!/usr/bin/env python3
"""Writes a one-layer OCI image archive (an OCI image layout in a tar) from a directory.

    oci-archive.py ROOT NAME OUT.tar [--user UID:GID] [--entrypoint PATH]... [--cmd ARG]...
                   [--env K=V]...

ROOT becomes the image's only layer, every entry owned by root, times zeroed and entries
sorted, so the same files give the same digests. NAME is the full reference
(`docker.io/library/bridgehead:0.1.0`): `ctr -n k8s.io images import OUT.tar` stores the image
under it, where containerd's CRI finds it for a pod naming `bridgehead:0.1.0`. No registry,
no daemon, standard library only: scripts/image.sh uses it for the images of the test nodes.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def layer_tar(root):
    """The layer: ROOT's tree as a tar, deterministic."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for parent, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs + files):
                paths.append(os.path.join(parent, name))
        for path in sorted(paths, key=lambda p: os.path.relpath(p, root)):
            info = tar.gettarinfo(path, arcname=os.path.relpath(path, root))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return data.getvalue()


def descriptor(media_type, blob, **extra):
    return dict(mediaType=media_type, digest="sha256:" + hashlib.sha256(blob).hexdigest(),
                size=len(blob), **extra)


def add(tar, name, blob):
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(blob))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("name")
    parser.add_argument("out")
    parser.add_argument("--user", default="")
    parser.add_argument("--entrypoint", action="append", default=[])
    parser.add_argument("--cmd", action="append", default=[])
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    if not os.path.isdir(args.root):
        sys.exit(f"oci-archive: {args.root} is not a directory")

    layer = layer_tar(args.root)
    image_config = {"User": args.user, "Entrypoint": args.entrypoint or None,
                    "Env": args.env or ["PATH=/usr/local/bin:/usr/bin:/bin"]}
    # Only when given: the archives written without one keep their digests.
    if args.cmd:
        image_config["Cmd"] = args.cmd
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers",
                   "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor(CONFIG, config),
        "layers": [descriptor(LAYER, layer)],
    }, sort_keys=True).encode()
    tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [descriptor(MANIFEST, manifest,
                                 platform={"architecture": "amd64", "os": "linux"},
                                 annotations={"io.containerd.image.name": args.name,
                                              "org.opencontainers.image.ref.name": tag})],
    }, sort_keys=True).encode()

    partial = f"{args.out}.{os.getpid()}.partial"
    with tarfile.open(partial, mode="w") as tar:
        add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add(tar, "index.json", index)
        for blob in (config, manifest, layer):
            add(tar, "blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob)
    # Whole or not at all: tests of several processes may build the same archive at once.
    os.replace(partial, args.out)


if __name__ == "__main__":
    main()
