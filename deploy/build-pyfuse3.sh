#!/usr/bin/env bash
# Build pyfuse3 with FUSE passthrough into a venv (called by `make install`).
#
# Why: a mount answers every read of a file itself unless the kernel is told to read a
# backing file directly (FUSE passthrough, Linux 6.9+).  That needs libfuse >= 3.16
# (Debian bookworm ships 3.14) and a pyfuse3 that passes a backing id with its open
# reply (3.5.0 does not).  So this script builds libfuse 3.17.2 from Debian's own
# source tarball into VENV/opt/libfuse and pyfuse3 3.5.0 from PyPI with
# deploy/pyfuse3.patch against it (an rpath points the module at that
# libfuse; the system's libfuse3 and fusermount3 stay as they are).  The patch also
# releases the GIL while libfuse reads a request from /dev/fuse, copies a write's data
# and sends a write's or a read's reply: the kernel's copies of up to 1 MiB no longer
# keep the mount's other threads (block streams, prefetches) waiting.  And a write's data
# reaches the mount as a read-only memoryview of libfuse's receive buffer, valid until the
# handler returns, instead of a 1 MiB copy into a new bytes per request.  FileInfo.noflush
# asks for FOPEN_NOFLUSH: a handle that never writes gets no FLUSH at close(2).
#
# Usage: deploy/build-pyfuse3.sh VENV
set -euo pipefail

VENV=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
PY="$VENV/bin/python"
FUSE_VERSION=3.17.2
FUSE_URL="http://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${FUSE_VERSION}.orig.tar.gz"
FUSE_SHA256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
PYFUSE3_VERSION=3.5.0
PYFUSE3_SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PREFIX="$VENV/opt/libfuse"
PATCH="$HERE/pyfuse3.patch"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "build-pyfuse3: $*" >&2; exit 1; }

"$PY" -m pip install -q meson==1.12.1 ninja==1.13.2

# libfuse sizes its receive buffers, and so the largest request it lets the kernel send,
# from FUSE_DEFAULT_MAX_PAGES_LIMIT (256 pages: 1 MiB) whenever the buffers are the
# caller's, as pyfuse3's are.  Linux 6.13+ takes up to /proc/sys/fs/fuse/max_pages_limit
# (1024 pages by default): built with 1024, a 14 MiB write reaches the mount as 4 requests
# of 4 MiB instead of 14 of 1 MiB, and reads come in 4 MiB requests (older kernels clamp
# to their own limit).  The stamp file says which build this prefix holds.
MAX_PAGES=1024
STAMP="$PREFIX/.max-pages-$MAX_PAGES"
if [ ! -e "$PREFIX/lib/libfuse3.so.4" ] || [ ! -e "$STAMP" ]; then
  curl -fsS -m 300 -o "$work/fuse.tar.gz" "$FUSE_URL" || fail "cannot download $FUSE_URL"
  echo "$FUSE_SHA256  $work/fuse.tar.gz" | sha256sum -c --quiet - || fail "checksum mismatch for $FUSE_URL"
  tar xzf "$work/fuse.tar.gz" -C "$work"
  sed -i "s/^#define FUSE_DEFAULT_MAX_PAGES_LIMIT 256$/#define FUSE_DEFAULT_MAX_PAGES_LIMIT $MAX_PAGES/" \
    "$work/fuse-$FUSE_VERSION/lib/fuse_i.h"
  grep -q "^#define FUSE_DEFAULT_MAX_PAGES_LIMIT $MAX_PAGES$" "$work/fuse-$FUSE_VERSION/lib/fuse_i.h" \
    || fail "cannot set FUSE_DEFAULT_MAX_PAGES_LIMIT in libfuse $FUSE_VERSION"
  # No utils (fusermount3, udev rules) and no examples: only the library is replaced.
  PATH="$VENV/bin:$PATH" "$VENV/bin/meson" setup "$work/fuse-$FUSE_VERSION/build" "$work/fuse-$FUSE_VERSION" \
    --prefix="$PREFIX" --libdir=lib --buildtype=release \
    -Dexamples=false -Dutils=false -Dtests=false -Ddisable-mtab=true >/dev/null
  PATH="$VENV/bin:$PATH" "$VENV/bin/meson" install -C "$work/fuse-$FUSE_VERSION/build" --quiet >/dev/null
  rm -f "$PREFIX"/.max-pages-*
  touch "$STAMP"
fi

"$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "pyfuse3==$PYFUSE3_VERSION"
echo "$PYFUSE3_SHA256  $work/pyfuse3-$PYFUSE3_VERSION.tar.gz" | sha256sum -c --quiet - \
  || fail "checksum mismatch for pyfuse3 $PYFUSE3_VERSION"
tar xzf "$work/pyfuse3-$PYFUSE3_VERSION.tar.gz" -C "$work"
src="$work/pyfuse3-$PYFUSE3_VERSION"
patch -s -p1 -d "$src" < "$PATCH" || fail "cannot apply $PATCH"
rm -f "$src/src/pyfuse3/__init__.c"     # generated from the patched .pyx instead
PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$PREFIX/lib" \
  "$PY" -m pip install -q --force-reinstall --no-deps "$src"
# (its dependency, trio, comes with the package's own install; `make install` then checks
# that `import pyfuse3` finds session_fd_number, i.e. this build)
