#!/usr/bin/env python3
"""Puts the binary of each package named, from its current Debian sid .deb, into BIN
(`/usr/bin/<package>` of the .deb, unpacked with dpkg -x): tools bookworm lacks or has too
old (cosign 3), Go static binaries needing only libc6. Each .deb is checked against the
sha256 sid's Packages index gives it. Usage:
    ci/sid-deb.py BIN PACKAGE...
"""
import hashlib
import lzma
import os
import shutil
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
    bin_dir, packages = sys.argv[1], sys.argv[2:]
    os.makedirs(bin_dir, exist_ok=True)
    found = index()
    for name in packages:
        if name not in found:
            sys.exit(f"sid has no package {name} ({MIRROR})")
        filename, sha, version = found[name]
        with urllib.request.urlopen(f"{MIRROR}/{filename}", timeout=300) as r:
            data = r.read()
        if hashlib.sha256(data).hexdigest() != sha:
            sys.exit(f"{filename}: sha256 is not the index's {sha}")
        with tempfile.TemporaryDirectory() as work:
            deb = os.path.join(work, "package.deb")
            with open(deb, "wb") as f:
                f.write(data)
            subprocess.run(["dpkg", "-x", deb, os.path.join(work, "root")], check=True)
            shutil.copy2(os.path.join(work, "root/usr/bin", name), os.path.join(bin_dir, name))
        print(f"{name} {version} into {bin_dir}")


main()
