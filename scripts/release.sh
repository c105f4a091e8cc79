#!/usr/bin/env bash
# Builds one Bridgehead release from this checkout into DIR (default dist/):
#
#   bridgehead-VERSION-linux-amd64.tar.gz   static bridgehead-server, -agent, -certs, LICENSE,
#   bridgehead-VERSION-linux-arm64.tar.gz   README.md, CHANGELOG.md
#   bridgehead.oci.tar        OCI image layout (index.json) whose index holds the linux/amd64
#                             and linux/arm64 images, built by buildah from ./Containerfile, tag
#                             docker.io/library/bridgehead:VERSION
#   bridgehead-VERSION.spdx.json   SPDX 2.3 SBOM: every crate in the binaries, every Debian
#                             package in the image (scripts/sbom.py)
#   bridgehead-CHART_VERSION.tgz   the Helm chart (charts/bridgehead, `helm package`), when there is one
#   SHA256SUMS                over every other file (`cd DIR && sha256sum -c SHA256SUMS`)
#
#   scripts/release.sh [--out DIR] [--platform linux/amd64|linux/arm64]... [--image-only]
#                      [--version VERSION]
#
# --platform (repeatable) builds only those platforms (default both); --image-only writes only
# the binaries and bridgehead.oci.tar (the test nodes' image). --version names the release
# something other than the workspace's version (a release candidate, `0.2.0-rc.1`; the upgrade
# drill's next version): the binaries' `--version` and `bridgehead_build_info`, the image's tag
# and label, the file names. It reaches the binaries through build-info's `BRIDGEHEAD_VERSION`,
# so only Bridgehead's own crates build again, not their dependencies.
#
# Reproducible: two runs from one commit (and version) write the same binaries, layers and
# archives (docs/release.md: how, and what was compared). The commit is `git rev-parse HEAD`,
# with `-dirty` when tracked files differ from it; times come from SOURCE_DATE_EPOCH (default:
# the commit's time).
#
# Needs: the Rust toolchain with the aarch64-unknown-linux-gnu target, gcc-aarch64-linux-gnu,
# buildah, apt-get and dpkg-deb (the image's base), python3, git; Go for the Helm chart
# (scripts/helm-build.sh). scripts/install-test-deps.sh installs the Debian packages.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="$root/dist"
platforms=()
image_only=""
version=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --platform) platforms+=("$2"); shift 2 ;;
    --image-only) image_only=1; shift ;;
    --version) version="$2"; shift 2 ;;
    *) echo "release: unknown argument $1 (usage: release.sh [--out DIR] [--platform P]... [--image-only] [--version V])" >&2; exit 64 ;;
  esac
done
# What build-info accepts (build-info/build.rs): refused here with the same reason, before
# anything builds.
if [[ -n "$version" && ! "$version" =~ ^[0-9][0-9A-Za-z.+-]{0,63}$ ]]; then
  echo "release: --version $version: digits, letters, '.', '-' and '+', starting with a digit" >&2
  exit 64
fi
((${#platforms[@]})) || platforms=(linux/amd64 linux/arm64)
for platform in "${platforms[@]}"; do
  case "$platform" in
    linux/amd64 | linux/arm64) ;;
    *) echo "release: --platform $platform: linux/amd64 and linux/arm64 are built" >&2; exit 64 ;;
  esac
done
for tool in cargo git buildah python3 apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "release: needs $tool (scripts/install-test-deps.sh)" >&2; exit 1; }
done

if [[ -n "$version" ]]; then
  export BRIDGEHEAD_VERSION="$version"
else
  # The workspace's version; one left in the environment would name the binaries otherwise.
  unset BRIDGEHEAD_VERSION
  version="$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "bridgehead-server"))')"
fi
commit="$(git rev-parse HEAD | cut -c1-12)"
if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
  commit="$commit-dirty"
  echo "release: tracked files differ from the commit; building $commit" >&2
fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
# scripts/build-static.sh computes the same; passed on so the labels and the binaries agree.
export BRIDGEHEAD_COMMIT="$commit"

# DIR holds one release: a previous one is replaced, anything else is left alone.
if [[ -d "$out" && -n "$(ls -A "$out")" && ! -f "$out/SHA256SUMS" && ! -f "$out/bridgehead.oci.tar" ]]; then
  echo "release: $out holds files that are not a release; choose another --out" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
mkdir -p "$root/target"
work="$(mktemp -d "$root/target/release-work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

triple() {
  case "$1" in
    linux/amd64) echo x86_64-unknown-linux-gnu ;;
    linux/arm64) echo aarch64-unknown-linux-gnu ;;
  esac
}

binaries=(bridgehead-server bridgehead-agent bridgehead-certs)
for platform in "${platforms[@]}"; do
  arch="${platform#linux/}"
  echo "==> scripts/build-static.sh $platform" >&2
  built="$(scripts/build-static.sh "$platform")"
  dir="$work/context/linux-$arch"
  mkdir -p "$dir"
  for b in "${binaries[@]}"; do
    cp "$built/$b" "$dir/$b"
  done
done

# The image: the Containerfile for each platform into one index, through buildah's own
# storage under the work directory (vfs: no overlay mounts; chroot: no runtime needed, and
# the Containerfile only copies, so nothing runs for the other architecture).
echo "==> image base (deploy/image/packages.txt)" >&2
scripts/image-base.sh "$work/context/base"
reference="docker.io/library/bridgehead:$version"
buildah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
list="bridgehead-release-$$"
"${buildah[@]}" manifest create "$list" >/dev/null
for platform in "${platforms[@]}"; do
  echo "==> buildah build --platform $platform" >&2
  "${buildah[@]}" build --quiet --isolation chroot --platform "$platform" \
    --timestamp "$SOURCE_DATE_EPOCH" --format oci --manifest "$list" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$commit" \
    -f Containerfile "$work/context" >/dev/null
done
# Pushed to a layout directory, then archived here with fixed names, order, owners and
# times, so the archive itself is as reproducible as the blobs in it.
"${buildah[@]}" manifest push --quiet --all --format oci "$list" "oci:$work/layout:$reference"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$work/layout" -cf "$out/bridgehead.oci.tar" .
"${buildah[@]}" manifest rm "$list" >/dev/null || true

if [[ -z "$image_only" ]]; then
  for platform in "${platforms[@]}"; do
    arch="${platform#linux/}"
    name="bridgehead-$version-linux-$arch"
    mkdir -p "$work/tarballs/$name"
    cp "${binaries[@]/#/$work/context/linux-$arch/}" LICENSE README.md CHANGELOG.md "$work/tarballs/$name/"
    tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
      -C "$work/tarballs" -cf - "$name" | gzip -9 -n >"$out/$name.tar.gz"
  done

  echo "==> SBOM" >&2
  targets=()
  for platform in "${platforms[@]}"; do targets+=(--target "$(triple "$platform")"); done
  python3 scripts/sbom.py --version "$version" --commit "$commit" "${targets[@]}" \
    --packages deploy/image/packages.txt >"$out/bridgehead-$version.spdx.json"

  charts=(charts/*/Chart.yaml)
  if [[ -f "${charts[0]}" ]]; then
    helm="$(scripts/helm-build.sh | awk 'NR == 1 {print $1}')"
    for chart in "${charts[@]}"; do
      echo "==> helm package $(dirname "$chart")" >&2
      "$helm" package "$(dirname "$chart")" --app-version "$version" --destination "$work/charts" >/dev/null
    done
    # helm package stamps every entry with the time it ran (helm 3.22 reads no
    # SOURCE_DATE_EPOCH), so two runs differed: the same entries, in helm's order, are written
    # again at SOURCE_DATE_EPOCH, owned by 0, under a gzip header without a time.
    for packaged in "$work"/charts/*.tgz; do
      python3 - "$packaged" "$out/$(basename "$packaged")" "$SOURCE_DATE_EPOCH" <<'PY'
import gzip, sys, tarfile
source, target, epoch = sys.argv[1], sys.argv[2], int(sys.argv[3])
with tarfile.open(source, "r:gz") as old, open(target, "wb") as raw:
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as new:
            for member in old.getmembers():
                member.mtime, member.uid, member.gid = epoch, 0, 0
                member.uname = member.gname = ""
                member.pax_headers = {}
                new.addfile(member, old.extractfile(member) if member.isfile() else None)
PY
    done
  else
    echo "release: no chart under charts/ (charts/bridgehead); no chart .tgz written" >&2
  fi
fi

(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort |
  xargs sha256sum >SHA256SUMS)
echo "release: $version ($commit) in $out" >&2
(cd "$out" && cat SHA256SUMS)
