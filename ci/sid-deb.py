#!/usr/bin/env python3
"""Unpacks the current Debian sid .deb of each package named into ROOT (dpkg -x): tools
bookworm lacks or has too old (cosign 3), which are Go static binaries needing only libc6.
Each .deb is checked against the sha256 the sid Packages index gives it. Usage:
    ci/sid-deb.py ROOT PACKAGE...
"""
import hashlib
import lzma
import os
import subprocess
import sys
import tempfile
import urllib.request

MIRROR = "http://deb.debian.org/debian"


def index():
    url = f"{MIRROR}/dists/sid/main/binary-amd64/Packages.xz"
    with urllib.request.urlopen(url, timeout=120) as r:
        text = lzma.decompress(r.read()).decode("utf-8", "replace")
    out = {}
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" ")
        )
        if "Package" in fields and "Filename" in fields:
            out[fields["Package"]] = (fields["Filename"], fields.get("SHA256", ""), fields.get("Version", ""))
    return out


def main():
    root, packages = sys.argv[1], sys.argv[2:]
    os.makedirs(root, exist_ok=True)
    found = index()
    for name in packages:
        if name not in found:
            sys.exit(f"sid has no package {name} ({MIRROR})")
        filename, sha, version = found[name]
        with urllib.request.urlopen(f"{MIRROR}/{filename}", timeout=300) as r:
            data = r.read()
        if hashlib.sha256(data).hexdigest() != sha:
            sys.exit(f"{filename}: sha256 is not the index's {sha}")
        with tempfile.NamedTemporaryFile(suffix=".deb") as deb:
            deb.write(data)
            deb.flush()
            subprocess.run(["dpkg", "-x", deb.name, root], check=True)
        print(f"{name} {version} unpacked into {root}")


main()
