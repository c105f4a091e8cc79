#!/usr/bin/env bash
# Pushes an OCI image archive to a registry with skopeo (Debian's), every platform it holds:
#
#   scripts/push-image.sh ARCHIVE REGISTRY/REPOSITORY:TAG [--cert-dir DIR]
#
# ARCHIVE is an OCI image layout, as a tar (`*.oci.tar`: scripts/image.sh's, or the release's
# from scripts/release.sh) or a directory. Its index.json may name one image, one image index
# (buildah's `manifest push --all` writes that), or several platform images side by side; the
# last are pushed as one image index, so that `REGISTRY/REPOSITORY:TAG` names every platform
# and each node pulls its own. --cert-dir DIR holds the CA that signed the registry's
# certificate (`*.crt`, as containerd's and skopeo's certs.d folders hold it); without it the
# system's CAs verify the registry. TLS is always verified. For a registry that wants a login,
# `skopeo login REGISTRY` first: skopeo reads the credentials it stores.
#
# Prints `REGISTRY/REPOSITORY@sha256:...`: the digest TAG now names.
set -euo pipefail

usage="usage: push-image.sh ARCHIVE REGISTRY/REPOSITORY:TAG [--cert-dir DIR]"
cert_dir=""
positional=()
while (($#)); do
  case "$1" in
    --cert-dir) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 64; }; cert_dir="$2"; shift 2 ;;
    --*) echo "push-image: unknown option $1; $usage" >&2; exit 64 ;;
    *) positional+=("$1"); shift ;;
  esac
done
((${#positional[@]} == 2)) || { echo "$usage" >&2; exit 64; }
archive="${positional[0]}"
reference="${positional[1]}"
[[ -e "$archive" ]] || { echo "push-image: no $archive" >&2; exit 66; }
# A reference with a registry host (a dot, a colon or localhost before the first slash) and a
# tag: without a host skopeo would pick docker.io, which is never meant here.
host="${reference%%/*}"
if [[ "$reference" != */* || ! ( "$host" == *.* || "$host" == *:* || "$host" == localhost ) ]]; then
  echo "push-image: $reference names no registry host (REGISTRY/REPOSITORY:TAG)" >&2
  exit 64
fi
if [[ "${reference##*/}" != *:* ]]; then
  echo "push-image: $reference has no tag (REGISTRY/REPOSITORY:TAG)" >&2
  exit 64
fi
command -v skopeo >/dev/null || { echo "push-image: needs skopeo (apt-get install skopeo)" >&2; exit 69; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
layout="$work/layout"
mkdir -p "$layout"
if [[ -d "$archive" ]]; then
  cp -a "$archive/." "$layout/"
else
  tar -xf "$archive" -C "$layout"
fi
[[ -f "$layout/index.json" ]] || { echo "push-image: $archive is not an OCI image layout (no index.json)" >&2; exit 65; }

# skopeo copies one entry of index.json; several platform images side by side become one
# image index (a blob of the layout), which index.json then names alone.
python3 - "$layout" <<'PY'
import hashlib, json, os, sys
layout = sys.argv[1]
with open(os.path.join(layout, "index.json")) as f:
    index = json.load(f)
manifests = index.get("manifests") or []
if not manifests:
    sys.exit("push-image: index.json names no image")
if len(manifests) > 1:
    platforms = [m.get("platform") for m in manifests]
    if None in platforms or len({json.dumps(p, sort_keys=True) for p in platforms}) != len(platforms):
        sys.exit("push-image: index.json names several images that are not one per platform")
    media = "application/vnd.oci.image.index.v1+json"
    nested = json.dumps({
        "schemaVersion": 2,
        "mediaType": media,
        "manifests": [{k: v for k, v in m.items() if k != "annotations"} for m in manifests],
    }, sort_keys=True).encode()
    digest = hashlib.sha256(nested).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(nested)
    index["manifests"] = [{"mediaType": media, "digest": "sha256:" + digest, "size": len(nested)}]
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f)
PY

# --preserve-digests: the registry serves the archive's own manifests and layers, byte for
# byte (skopeo would otherwise compress uncompressed layers, and so change every digest): one
# image everywhere, the release's digest the one nodes run. The signature policy: accept this
# local source the project built (skopeo refuses to run without a policy, and a machine may
# have none in /etc/containers).
printf '{"default":[{"type":"insecureAcceptAnything"}]}\n' >"$work/policy.json"
tls=(--dest-tls-verify=true)
[[ -n "$cert_dir" ]] && tls+=(--dest-cert-dir "$cert_dir")
skopeo --policy "$work/policy.json" copy --quiet --all --preserve-digests --digestfile "$work/digest" "${tls[@]}" \
  "oci:$layout" "docker://$reference" >&2
echo "${reference%:*}@$(cat "$work/digest")"
