#!/usr/bin/env bash
# Build the container image (`make image`): deploy/container/Containerfile, tagged
# curvine-py:VERSION (pyproject.toml's version), with buildah or podman.
#
# Runs on a fresh Debian machine as root, non-interactive:
# - the engine: $ENGINE, else buildah or podman when installed, else buildah from apt.
# - the base: $BASE_IMAGE when set; else debian:bookworm-slim from its registry when a pull
#   succeeds within $REGISTRY_TIMEOUT seconds (default 60); else a local Debian bookworm
#   base, localhost/curvine-py-base:bookworm, made once with debootstrap (from apt) from the
#   Debian mirror this machine's apt uses, with this machine's apt sources (bookworm,
#   -updates, -security), and reused after (REBUILD_BASE=1 makes it again).
# - the build: chroot isolation (no network namespace, bridge or OCI runtime needed; the
#   build's RUN steps use this machine's network and DNS), layers cached, at nice 10.
#   FUSE_MIRROR, PIP_INDEX_URL and PIP_EXTRA_INDEX_URL pass through as build arguments when
#   set; PIP_INDEX_URL defaults to this machine's pip's index-url, and the CA bundle its pip
#   trusts (PIP_CERT or pip's cert) is mounted into the build's RUN steps.
# The image build itself fails when the mount cannot load pyfuse3 (the Containerfile checks).
#
# Usage: deploy/build-image.sh [TAG]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=$(sed -n '/^version *= *"/{s/^version *= *"\(.*\)"/\1/p;q}' "$ROOT/pyproject.toml")
TAG=${1:-curvine-py:$VERSION}
REGISTRY_BASE=docker.io/library/debian:bookworm-slim
LOCAL_BASE=localhost/curvine-py-base:bookworm
SUITE=bookworm

say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages and builds with chroot isolation)"

apt_install() {
  local missing="" p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  say "installing Debian packages:$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# ---------------------------------------------------------------- the engine
ENGINE=${ENGINE:-}
if [ -z "$ENGINE" ]; then
  for e in buildah podman; do
    if command -v "$e" >/dev/null; then ENGINE=$e; break; fi
  done
fi
if [ -z "$ENGINE" ]; then
  apt_install buildah
  ENGINE=buildah
fi
case "$ENGINE" in
  buildah | podman) ;;
  *) die "ENGINE=$ENGINE: buildah or podman (docker users: docker build -f deploy/container/Containerfile .)" ;;
esac
command -v "$ENGINE" >/dev/null || apt_install "$ENGINE"
say "engine: $ENGINE $("$ENGINE" --version | awk '{print $3}')"

image_exists() {
  if [ "$ENGINE" = buildah ]; then buildah images -q "$1" >/dev/null 2>&1; else podman image exists "$1"; fi
}

# ---------------------------------------------------------------- the base
# The base URIs (with their suite) of the Debian archives this machine's apt reads for
# bookworm, from apt itself: "URI SUITE" lines.
apt_archives() {
  local out
  out=$(apt-get indextargets --format '$(REPO_URI) $(CODENAME)' 'Created-By: Packages' 2>/dev/null | sort -u)
  if [ -z "$out" ]; then
    apt-get update -qq
    out=$(apt-get indextargets --format '$(REPO_URI) $(CODENAME)' 'Created-By: Packages' | sort -u)
  fi
  awk -v s="$SUITE" '$2 == s || index($2, s "-") == 1' <<<"$out"
}

make_local_base() {
  local archives mirror root ctr uri suite
  apt_install debootstrap
  archives=$(apt_archives)
  mirror=$(awk -v s="$SUITE" '$2 == s { print $1; exit }' <<<"$archives")
  [ -n "$mirror" ] || die "this machine's apt reads no Debian $SUITE archive to debootstrap from"
  root=$(mktemp -d /var/tmp/curvine-base.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$root' '$root.tar' '$root.log'" EXIT
  say "debootstrap $SUITE (minbase) from $mirror"
  nice -n 10 debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; die "debootstrap failed (its last lines above)"; }
  rm -f "$root.log"
  # apt in the image reads the archives this machine reads (the release, its updates and
  # its security archive), as debian:bookworm-slim's debian.sources does
  rm -f "$root/etc/apt/sources.list"
  while read -r uri suite; do
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n' \
      "${uri%/}" "$suite"
  done <<<"$archives" >"$root/etc/apt/sources.list.d/debian.sources"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
  # no daemons start when packages are installed in a build
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod 0755 "$root/usr/sbin/policy-rc.d"
  tar -C "$root" -cf "$root.tar" .
  rm -rf "$root"
  if [ "$ENGINE" = buildah ]; then
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$root.tar" / >/dev/null     # a local tar is unpacked
    buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    buildah commit --quiet --rm "$ctr" "$LOCAL_BASE" >/dev/null
  else
    podman import --quiet --change 'CMD ["/bin/bash"]' "$root.tar" "$LOCAL_BASE" >/dev/null
  fi
  rm -f "$root.tar"
  trap - EXIT
}

BASE=${BASE_IMAGE:-}
if [ -z "$BASE" ]; then
  if timeout "${REGISTRY_TIMEOUT:-60}" "$ENGINE" pull -q "$REGISTRY_BASE" >/dev/null 2>&1; then
    BASE=$REGISTRY_BASE
  else
    say "cannot pull $REGISTRY_BASE within ${REGISTRY_TIMEOUT:-60} s: a local Debian $SUITE base instead"
    if [ -n "${REBUILD_BASE:-}" ] || ! image_exists "$LOCAL_BASE"; then
      make_local_base
    fi
    BASE=$LOCAL_BASE
  fi
fi
say "base: $BASE"

# ---------------------------------------------------------------- the build
# This machine's pip setting KEY (its environment, then its config files), empty when none.
pip_setting() {
  local out
  out=$(python3 -m pip config list 2>/dev/null) || return 0     # no python3 or no pip: none
  awk -v k="$1" '
    { i = index($0, "=") }
    !found && i && (substr($0, 1, i - 1) == ":env:." k || substr($0, 1, i - 1) == "global." k) {
      v = substr($0, i + 1); gsub(/^'"'"'|'"'"'$/, "", v); print v; found = 1 }' <<<"$out"
}
args=(--build-arg "BASE_IMAGE=$BASE")
PIP_INDEX_URL=${PIP_INDEX_URL:-$(pip_setting index-url)}
for v in FUSE_MIRROR PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
  if [ -n "${!v:-}" ]; then args+=(--build-arg "$v=${!v}"); fi
done
# The CA bundle this machine's pip trusts (PIP_CERT, pip's cert; e.g. with a mirror behind a
# TLS-inspecting proxy): the build's pip gets a copy, in a directory bind-mounted over the
# base's empty /mnt for the RUN steps only: the image keeps neither it nor a mount point.
PIP_CERT=${PIP_CERT:-$(pip_setting cert)}
if [ -n "$PIP_CERT" ] && [ -r "$PIP_CERT" ]; then
  certs=$(mktemp -d /var/tmp/curvine-build-ca.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$certs'" EXIT
  cp "$PIP_CERT" "$certs/pip-ca.crt" && chmod -R a+rX "$certs"
  args+=(--volume "$certs:/mnt:ro" --build-arg PIP_CERT=/mnt/pip-ca.crt)
fi
say "building $TAG"
start=$SECONDS
if [ "$ENGINE" = buildah ]; then
  nice -n 10 buildah build --isolation chroot --layers --pull=false "${args[@]}" \
    -f "$ROOT/deploy/container/Containerfile" -t "$TAG" "$ROOT"
else
  nice -n 10 podman build --isolation chroot --layers --pull=false "${args[@]}" \
    -f "$ROOT/deploy/container/Containerfile" -t "$TAG" "$ROOT"
fi
say "built $TAG in $((SECONDS - start)) s (base $BASE)"
