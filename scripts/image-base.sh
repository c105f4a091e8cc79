#!/usr/bin/env bash
# Writes the root file system the Bridgehead image starts from (the Containerfile's `COPY
# base/ /`), made of nothing but the Debian packages pinned in deploy/image/packages.txt and a
# few files written here: no registry, no host libraries.
#
#   scripts/image-base.sh OUT_DIR
#
# OUT_DIR receives:
#   usr/share/ca-certificates/..., usr/share/doc/<package>/copyright   from the pinned .debs
#   etc/ssl/certs/ca-certificates.crt   the bundle update-ca-certificates would write (every
#                                       certificate of the package, in path order)
#   var/lib/dpkg/status.d/<package>     each package's control data, as distroless images keep
#                                       them, so image scanners know what the image holds
#   etc/passwd, etc/group               root and nonroot (65532), the user the image runs as
#   tmp (1777), home/nonroot
# Each .deb is fetched with `apt-get download` (cached in target/image-base/debs) and checked
# against the pinned version and SHA-256 before it is unpacked. Needs apt-get and dpkg-deb.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: image-base.sh OUT_DIR}"
pins="$root/deploy/image/packages.txt"
cache="$root/target/image-base/debs"
mkdir -p "$cache" "$out"

while read -r package version arch sha256; do
  [[ -z "$package" || "$package" == \#* ]] && continue
  deb="$cache/${package}_${version//:/%3a}_${arch}.deb"
  if [[ ! -f "$deb" ]] || ! echo "$sha256  $deb" | sha256sum -c --status; then
    rm -f "$deb"
    # apt-get writes into the current directory, as the _apt user where it can.
    if ! (cd "$cache" && apt-get download -q "$package:$arch=$version" >/dev/null 2>&1); then
      echo "image-base: cannot download $package=$version ($arch): is it still in the archive?" \
        "Run apt-get update, or move the pin in $pins" >&2
      exit 1
    fi
  fi
  echo "$sha256  $deb" | sha256sum -c --status || {
    echo "image-base: $deb does not match the SHA-256 pinned in $pins" >&2
    exit 1
  }
  got="$(dpkg-deb -f "$deb" Package Version Architecture | awk '{print $2}' | paste -sd' ')"
  [[ "$got" == "$package $version $arch" ]] || {
    echo "image-base: $deb is $got, pinned $package $version $arch" >&2
    exit 1
  }
  unpacked="$(mktemp -d)"
  dpkg-deb -x "$deb" "$unpacked"
  case "$package" in
    ca-certificates)
      # The certificates and their license; not update-ca-certificates (a shell script, and
      # the image has no shell): its one job, the bundle, is done below.
      mkdir -p "$out/usr/share"
      cp -a "$unpacked/usr/share/ca-certificates" "$out/usr/share/"
      mkdir -p "$out/etc/ssl/certs"
      find "$out/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat \
        >"$out/etc/ssl/certs/ca-certificates.crt"
      ;;
    *)
      cp -a "$unpacked/." "$out/"
      ;;
  esac
  mkdir -p "$out/usr/share/doc/$package"
  cp "$unpacked/usr/share/doc/$package/copyright" "$out/usr/share/doc/$package/copyright"
  rm -rf "$unpacked"
  mkdir -p "$out/var/lib/dpkg/status.d"
  { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } >"$out/var/lib/dpkg/status.d/$package"
done <"$pins"

mkdir -p "$out/etc" "$out/tmp" "$out/home/nonroot"
chmod 1777 "$out/tmp"
chmod 0755 "$out/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$out/etc/group"
