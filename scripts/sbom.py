#!/usr/bin/env python3
"""Writes the release's SBOM (SPDX 2.3 JSON) on stdout: every crate built into
bridgehead-server, bridgehead-agent and bridgehead-certs for each --target, and every Debian
package in the image's base (deploy/image/packages.txt).

    sbom.py --version V --commit C --target TRIPLE... --packages deploy/image/packages.txt

The crates are what cargo resolves for the three packages on each target, following normal
dependencies only (build scripts' and tests' dependencies are not in the binaries; proc-macro
crates are kept: they write code that is), with the SHA-256 Cargo.lock pins. A scanner reading
the binaries (syft, say) cannot list them: a Rust binary records no dependency list unless
built with cargo-auditable. Output is a function of the tree and SOURCE_DATE_EPOCH alone, so
two runs from one commit write the same file.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib

BINARIES = ("bridgehead-server", "bridgehead-agent", "bridgehead-certs")


def spdx_id(*parts):
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", "-".join(parts))


def crates(root, targets):
    """{(name, version): package metadata} of every crate in the binaries on any target."""
    found = {}
    for target in targets:
        metadata = json.loads(subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target],
            cwd=root, check=True, capture_output=True).stdout)
        packages = {p["id"]: p for p in metadata["packages"]}
        nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
        todo = [i for i, p in packages.items()
                if p["name"] in BINARIES and p["source"] is None]
        seen = set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            for dep in nodes[node]["deps"]:
                if any(kind["kind"] is None for kind in dep["dep_kinds"]):
                    todo.append(dep["pkg"])
        for node in seen:
            package = packages[node]
            found[(package["name"], package["version"])] = package
    return found


def lock_checksums(root):
    with open(os.path.join(root, "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    return {(p["name"], p["version"]): p["checksum"] for p in lock["package"] if "checksum" in p}


def license_expression(text):
    if not text:
        return "NOASSERTION"
    # Cargo's old `MIT/Apache-2.0` means either.
    return " OR ".join(part.strip() for part in text.split("/"))


def debian_packages(path):
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields and not fields[0].startswith("#"):
                yield fields[:4]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--packages", required=True)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))

    product = spdx_id("bridgehead", args.version)
    packages = [{
        "SPDXID": product,
        "name": "bridgehead",
        "versionInfo": args.version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "Apache-2.0",
        "licenseDeclared": "Apache-2.0",
        "copyrightText": "NOASSERTION",
        "sourceInfo": f"built from commit {args.commit} for {', '.join(args.target)}",
    }]
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                      "relatedSpdxElement": product}]
    checksums = lock_checksums(root)
    for (name, version), package in sorted(crates(root, args.target).items()):
        if package["source"] is None:
            continue  # the workspace's own crates: the product itself
        element = spdx_id("crate", name, version)
        entry = {
            "SPDXID": element,
            "name": name,
            "versionInfo": version,
            "downloadLocation": f"https://crates.io/api/v1/crates/{name}/{version}/download",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": license_expression(package.get("license")),
            "copyrightText": "NOASSERTION",
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": f"pkg:cargo/{name}@{version}"}],
        }
        if (name, version) in checksums:
            entry["checksums"] = [{"algorithm": "SHA256",
                                   "checksumValue": checksums[(name, version)]}]
        packages.append(entry)
        relationships.append({"spdxElementId": product, "relationshipType": "CONTAINS",
                              "relatedSpdxElement": element})
    for name, version, arch, sha256 in debian_packages(args.packages):
        element = spdx_id("deb", name, version, arch)
        packages.append({
            "SPDXID": element,
            "name": name,
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "checksums": [{"algorithm": "SHA256", "checksumValue": sha256}],
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator":
                                  f"pkg:deb/debian/{name}@{version}?arch={arch}&distro=debian-12"}],
            "comment": "in the container image's base (deploy/image/packages.txt)",
        })
        relationships.append({"spdxElementId": product, "relationshipType": "CONTAINS",
                              "relatedSpdxElement": element})
    document = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"bridgehead-{args.version}",
        "documentNamespace": f"urn:bridgehead:sbom:{args.version}:{args.commit}",
        "creationInfo": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
            "creators": ["Tool: bridgehead scripts/sbom.py"],
        },
        "packages": packages,
        "relationships": relationships,
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
