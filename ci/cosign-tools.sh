#!/usr/bin/env bash
# The tools the signature tests run against, into .tools/ (git-ignored), from Debian's
# packages only: cosign (the real verifier, sid's cosign 3: Go static binaries that need
# only libc6 >= 2.34, so `dpkg -x` of the .deb runs on bookworm) and a registry with the
# OCI 1.1 referrers API (crates/testkit/refreg/main.go built with bookworm's golang-go
# against sid's go-containerregistry source package). Debian 12's own packages have
# neither (its docker-registry 2.8 has no referrers API; trixie's cosign is 2.5).
# The tests find them at .tools/bin/{cosign,refreg} (or $COMMSTACK_COSIGN, $COMMSTACK_REFREG).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.tools/bin
[ -x $bin/cosign ] && [ -x $bin/refreg ] && exit 0
for tool in go:golang-go xz:xz-utils curl:curl; do
    command -v ${tool%%:*} >/dev/null || { apt-get update -qq && apt-get install -y -qq ${tool#*:} >/dev/null; }
done
work=.tools/debs
mkdir -p $work $bin
mirror=http://deb.debian.org/debian
# The sid file names change with each upload: read them from sid's package index.
curl -fsSL $mirror/dists/sid/main/binary-amd64/Packages.xz | xz -dc > $work/Packages
field() {
    awk -v p="$1" -v f="$2:" '$1=="Package:"{hit=($2==p)} hit&&$1==f{print $2; exit}' $work/Packages
}
for package in cosign golang-github-google-go-containerregistry-dev; do
    file=$(field $package Filename)
    [ -n "$file" ] || { echo "$package is not in Debian sid's index" >&2; exit 1; }
    curl -fsSL "$mirror/$file" -o "$work/$package.deb"
    # Held to the index's sha256 (the download is plain HTTP).
    echo "$(field $package SHA256)  $work/$package.deb" | sha256sum -c --quiet - \
        || { echo "$file does not match the sha256 of sid's index: download again" >&2; exit 1; }
    dpkg -x "$work/$package.deb" $work/root
done
cp $work/root/usr/bin/cosign $bin/cosign
gopath=$(mktemp -d)
mkdir -p "$gopath/src/refreg"
cp crates/testkit/refreg/main.go "$gopath/src/refreg/"
# GOPATH mode: pkg/registry needs only the standard library and go-containerregistry.
GOPATH="$gopath:$PWD/$work/root/usr/share/gocode" GO111MODULE=off GOFLAGS= \
    go build -o $bin/refreg refreg
rm -rf "$gopath" $work
$bin/cosign version 2>/dev/null | grep -E '^GitVersion' || true
echo "cosign and refreg in $bin"
