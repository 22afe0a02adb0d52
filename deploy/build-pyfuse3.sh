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
# asks for FOPEN_NOFLUSH: a handle that never writes gets no FLUSH at close(2).  And it adds
# libfuse's lock handlers, which pyfuse3 3.5 lacks: an Operations with getlk/setlk (and
# flock) gets POSIX (and flock) locks from the kernel, with the lock owner, a callable
# saying whether the request was interrupted (a signal), and forget_locks at the close
# that ends an owner's locks (FLUSH's lock_owner, RELEASE's flock_release);
# pyfuse3.locks_enabled() says what the kernel agreed to at init (FUSE_CAP_POSIX_LOCKS,
# FUSE_CAP_FLOCK_LOCKS, asked for only with the handlers there).  Likewise libfuse's
# fallocate, lseek (SEEK_DATA/SEEK_HOLE) and tmpfile (O_TMPFILE) handlers, wired only for
# an Operations that has them (docs/posix.md "Space").
#
# Where libfuse's tarball comes from: the Debian mirror(s) this machine's apt is configured
# with (deb822 `URIs:` in /etc/apt/sources.list.d/*.sources, `deb` lines of
# /etc/apt/sources.list and *.list), or $FUSE_MIRROR when set.  A mirror's pool/ is the
# same for every suite, so the 3.17.2 orig tarball (a trixie-era upload) is found under the
# base URI of a bookworm mirror too.  (`apt-get source` would need deb-src entries and a
# suite that has 3.17.2; neither is there on a stock bookworm.)  apt's own downloader
# (apt-helper, with apt's proxy settings) fetches it when present, else curl; the sha256 is
# checked either way.
#
# When the patched build cannot happen (offline, no compiler, checksum mismatch, a patch
# that no longer applies, a module that does not load) the script does not fail: it prints
# one warning line saying why, installs PyPI's pyfuse3 3.5.0 against the system's libfuse3
# (a mount that works without FUSE passthrough, FOPEN_NOFLUSH and 4 MiB requests), and
# exits 0.  The details are in VENV/pyfuse3-build.log; VENV/opt/pyfuse3-stock marks such
# an install.
#
# Every pyfuse3 this script builds or keeps is loaded first (`--check` below): its
# extension module is dlopen()ed with every symbol resolved at once, so a module compiled
# against libfuse 3.17's headers but linked to the system's 3.14 ("undefined symbol:
# fuse_session_new_versioned") is never left behind as if it worked.  One that does not
# load is replaced by the stock one, and that is loaded too; when neither loads, none is
# left installed (the warning says the mount is unavailable).
#
# Usage: deploy/build-pyfuse3.sh VENV           (FUSE_MIRROR=BASE to name the Debian mirror)
#        deploy/build-pyfuse3.sh --check VENV   does VENV's pyfuse3 load?  One line: which
#            pyfuse3 (patched or stock) and which libfuse, or why not (exit 1).  With trio
#            installed (the package's install brings it) this is a real `import pyfuse3`.
set -euo pipefail

CHECK_ONLY=""
if [ "${1:-}" = --check ]; then
  CHECK_ONLY=1
  shift
fi
[ $# -eq 1 ] || { echo "usage: $0 [--check] VENV" >&2; exit 2; }
VENV=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
PY="$VENV/bin/python"
FUSE_VERSION=3.17.2
FUSE_POOL_PATH="pool/main/f/fuse3/fuse3_${FUSE_VERSION}.orig.tar.gz"
FUSE_SHA256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
PYFUSE3_VERSION=3.5.0
PYFUSE3_SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PREFIX="$VENV/opt/libfuse"
PATCH="$HERE/pyfuse3.patch"
LOG="$VENV/pyfuse3-build.log"
STOCK_MARK="$VENV/opt/pyfuse3-stock"

fail() { echo "build-pyfuse3: $*" >&2; exit 1; }
# The installed pyfuse3's extension module, found without importing it (its dependency,
# trio, comes later, with the package's own install); fails when there is none.
pyfuse3_so() { "$PY" -c "import importlib.util as u, sys; s = u.find_spec('pyfuse3'); sys.exit(s is None or print(s.origin))"; }

# Does the installed pyfuse3 load?  Without trio, its extension module is dlopen()ed by the
# venv's python with RTLD_NOW: every symbol resolved now, against the libfuse it finds (the
# Python C-API's symbols are those of the process), as an import would, without running it.
# With trio, `import pyfuse3` itself.  Prints which pyfuse3 and libfuse, or (exit 1) why not.
pyfuse3_loads() {
  "$PY" - <<'PYEOF'
import ctypes, importlib.util, os, sys
spec = importlib.util.find_spec("pyfuse3")
if spec is None or not spec.origin:
    sys.exit("no pyfuse3 is installed")
so = spec.origin
try:
    ctypes.CDLL(so, mode=os.RTLD_NOW | os.RTLD_LOCAL)
except OSError as e:
    # "<so>: undefined symbol: fuse_session_new_versioned" -> the part after the path
    msg = str(e)
    sys.exit("pyfuse3 does not load: " + (msg[len(so) + 2:] if msg.startswith(so + ": ") else msg))
how = "loads"
if importlib.util.find_spec("trio") is not None:
    try:
        import pyfuse3
    except Exception as e:
        sys.exit(f"import pyfuse3 fails: {type(e).__name__}: {e}")
    how = "imports"
libfuse = "?"
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1]
        if "/libfuse3.so" in path:
            libfuse = path
            break
kind = "patched" if b"session_fd_number" in open(so, "rb").read() else "stock"
print(f"pyfuse3 {how} ({kind}, libfuse {libfuse})")
PYEOF
}

if [ -n "$CHECK_ONLY" ]; then
  if out=$(pyfuse3_loads 2>&1); then
    echo "build-pyfuse3: $out"
    exit 0
  fi
  echo "build-pyfuse3: $VENV: $(tail -n 1 <<<"$out")" >&2
  exit 1
fi

# ---------------------------------------------------------------- the fallback (the parent)
# The patched build runs as a child of this script with errexit; when it fails, the
# parent installs the stock pyfuse3 instead.
if [ "${BUILD_PYFUSE3_STAGE:-}" != patched ]; then
  mkdir -p "$VENV/opt"
  : >"$LOG"
  if BUILD_PYFUSE3_STAGE=patched bash "$0" "$@" >>"$LOG" 2>&1; then
    rm -f "$STOCK_MARK"
    exit 0
  fi
  why=$(sed -n 's/^build-pyfuse3: //p' "$LOG" | tail -n 1)
  why=${why:-"the build failed"}
  # a pyfuse3 is there already (an earlier build, patched or not, or the one the failed
  # build installed): kept only when it loads
  if pyfuse3_so >/dev/null 2>&1; then
    if loaded=$(pyfuse3_loads 2>&1); then
      echo "$loaded (kept)" >>"$LOG"
      if [[ $loaded == *"(patched,"* ]]; then
        echo "warning: patched pyfuse3 not rebuilt ($why; log: $LOG): keeping the one already installed" >&2
        rm -f "$STOCK_MARK"
      else
        echo "warning: patched pyfuse3 not built ($why; log: $LOG): stock pyfuse3 with the" \
             "system's libfuse3 kept, so FUSE passthrough and 4 MiB requests are off" >&2
        touch "$STOCK_MARK"
      fi
      exit 0
    fi
    why="$why; the installed $(tail -n 1 <<<"$loaded")"
    echo "build-pyfuse3: $why" >>"$LOG"
  fi
  touch "$STOCK_MARK"
  # PyPI's pyfuse3, built against the system's libfuse3
  if "$PY" -m pip install -q --force-reinstall --no-deps "pyfuse3==$PYFUSE3_VERSION" >>"$LOG" 2>&1; then
    if loaded=$(pyfuse3_loads 2>&1); then
      echo "$loaded" >>"$LOG"
      echo "warning: patched pyfuse3 not built ($why; log: $LOG): stock pyfuse3 $PYFUSE3_VERSION with the" \
           "system's libfuse3, so FUSE passthrough and 4 MiB requests are off" >&2
      exit 0
    fi
    stock="stock pyfuse3 $PYFUSE3_VERSION installed but $(tail -n 1 <<<"$loaded")"
  else
    stock="stock pyfuse3 $PYFUSE3_VERSION failed too"
  fi
  echo "build-pyfuse3: $stock" >>"$LOG"
  # nothing that cannot load is left behind: the install then goes on without [fuse]
  "$PY" -m pip uninstall -q -y pyfuse3 >>"$LOG" 2>&1 || true
  echo "warning: pyfuse3 not built ($why; $stock; log: $LOG):" \
       "no FUSE mount on this machine (cv mount is unavailable)" >&2
  exit 0
fi

# ---------------------------------------------------------------- the patched build (the child)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The base URIs of the Debian mirrors apt uses, those serving this release's suites first
# (then any other; the security archive's pool has no fuse3 3.17.2, a try costs one 404).
debian_mirrors() {
  local codename="" f
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true
  {
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -r "$f" ] || continue
      # deb822: stanzas separated by blank lines; print "rank uri" for each URI of a stanza
      awk -v cn="$codename" '
        function flush(   i, n, u, rank) {
          if (uris != "" && types ~ /(^| )deb( |$)/) {
            rank = 1
            n = split(suites, s, " ")
            for (i = 1; i <= n; i++) if (cn != "" && (s[i] == cn || index(s[i], cn "-") == 1)) rank = 0
            n = split(uris, u, " ")
            for (i = 1; i <= n; i++) print rank, u[i]
          }
          uris = ""; suites = ""; types = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        tolower($1) == "uris:"   { $1 = ""; uris = $0 }
        tolower($1) == "suites:" { $1 = ""; suites = $0 }
        tolower($1) == "types:"  { $1 = ""; types = $0 " " }
        END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -r "$f" ] || continue
      # one-line format: deb [options] URI SUITE COMPONENT...
      awk -v cn="$codename" '
        $1 != "deb" { next }
        { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } }
        { rank = (cn != "" && ($(i+1) == cn || index($(i+1), cn "-") == 1)) ? 0 : 1; print rank, $i }' "$f"
    done
  } | sort -s -k1,1n | awk '!seen[$2]++ { print $2 }' | sed 's:/*$::'
}

# Download libfuse's orig tarball from the first mirror that has it with the right sha256.
fetch_libfuse() {
  local dest="$1" base url tried=""
  local bases
  if [ -n "${FUSE_MIRROR:-}" ]; then
    bases=${FUSE_MIRROR%/}
  else
    bases=$(debian_mirrors)
  fi
  for base in $bases; do
    case "$base" in
      http:/* | https:/*) ;;
      *) continue ;;            # cdrom:, file:, mirror+file: ... : not a place to fetch from
    esac
    url="$base/$FUSE_POOL_PATH"
    tried="$tried $base"
    rm -f "$dest"
    if [ -x /usr/lib/apt/apt-helper ]; then
      /usr/lib/apt/apt-helper download-file "$url" "$dest" "SHA256:$FUSE_SHA256" >&2 || continue
    else
      curl -fsS --connect-timeout 20 -m 300 -o "$dest" "$url" >&2 || continue
    fi
    if echo "$FUSE_SHA256  $dest" | sha256sum -c --quiet - >&2; then
      echo "build-pyfuse3: libfuse $FUSE_VERSION from $url" >&2
      return 0
    fi
    echo "build-pyfuse3: checksum mismatch for $url" >&2
  done
  if [ -z "$tried" ] && [ -n "${FUSE_MIRROR:-}" ]; then
    fail "FUSE_MIRROR ($FUSE_MIRROR) is not an http or https URL to fetch libfuse $FUSE_VERSION from"
  elif [ -z "$tried" ]; then
    fail "no Debian mirror (http or https) in apt's sources to fetch libfuse $FUSE_VERSION from"
  fi
  fail "cannot download libfuse $FUSE_VERSION with the right sha256 from:$tried"
}

command -v cc >/dev/null || command -v gcc >/dev/null || fail "no C compiler (gcc)"
command -v patch >/dev/null || fail "no patch(1)"
"$PY" -m pip install -q meson==1.12.1 ninja==1.13.2 || fail "cannot install meson and ninja"

# libfuse sizes its receive buffers, and so the largest request it lets the kernel send,
# from FUSE_DEFAULT_MAX_PAGES_LIMIT (256 pages: 1 MiB) whenever the buffers are the
# caller's, as pyfuse3's are.  Linux 6.13+ takes up to /proc/sys/fs/fuse/max_pages_limit
# (1024 pages by default): built with 1024, a 14 MiB write reaches the mount as 4 requests
# of 4 MiB instead of 14 of 1 MiB, and reads come in 4 MiB requests (older kernels clamp
# to their own limit).  The stamp file says which build this prefix holds.
MAX_PAGES=1024
STAMP="$PREFIX/.max-pages-$MAX_PAGES"
if [ ! -e "$PREFIX/lib/libfuse3.so.4" ] || [ ! -e "$STAMP" ]; then
  fetch_libfuse "$work/fuse.tar.gz"
  tar xzf "$work/fuse.tar.gz" -C "$work"
  sed -i "s/^#define FUSE_DEFAULT_MAX_PAGES_LIMIT 256$/#define FUSE_DEFAULT_MAX_PAGES_LIMIT $MAX_PAGES/" \
    "$work/fuse-$FUSE_VERSION/lib/fuse_i.h"
  grep -q "^#define FUSE_DEFAULT_MAX_PAGES_LIMIT $MAX_PAGES$" "$work/fuse-$FUSE_VERSION/lib/fuse_i.h" \
    || fail "cannot set FUSE_DEFAULT_MAX_PAGES_LIMIT in libfuse $FUSE_VERSION"
  # No utils (fusermount3, udev rules) and no examples: only the library is replaced.
  PATH="$VENV/bin:$PATH" "$VENV/bin/meson" setup "$work/fuse-$FUSE_VERSION/build" "$work/fuse-$FUSE_VERSION" \
    --prefix="$PREFIX" --libdir=lib --buildtype=release \
    -Dexamples=false -Dutils=false -Dtests=false -Ddisable-mtab=true \
    || fail "cannot configure libfuse $FUSE_VERSION (meson)"
  PATH="$VENV/bin:$PATH" "$VENV/bin/meson" install -C "$work/fuse-$FUSE_VERSION/build" --quiet \
    || fail "cannot build libfuse $FUSE_VERSION"
  rm -f "$PREFIX"/.max-pages-*
  touch "$STAMP"
fi

# --no-binary for pyfuse3 only: with :all:, pip builds the sdist's own build requirements
# (Cython, setuptools) from source to read its metadata, ~3 minutes on 2 cores for nothing.
"$PY" -m pip download -q --no-deps --no-binary pyfuse3 -d "$work" "pyfuse3==$PYFUSE3_VERSION" \
  || fail "cannot download pyfuse3 $PYFUSE3_VERSION's source"
echo "$PYFUSE3_SHA256  $work/pyfuse3-$PYFUSE3_VERSION.tar.gz" | sha256sum -c --quiet - \
  || fail "checksum mismatch for pyfuse3 $PYFUSE3_VERSION"
tar xzf "$work/pyfuse3-$PYFUSE3_VERSION.tar.gz" -C "$work"
src="$work/pyfuse3-$PYFUSE3_VERSION"
patch -s -p1 -d "$src" < "$PATCH" || fail "cannot apply $PATCH"
rm -f "$src/src/pyfuse3/__init__.c"     # generated from the patched .pyx instead
# pkg-config gives "-I$PREFIX/include/fuse3" and "-L$PREFIX/lib -lfuse3", but setuptools
# puts those -L/-l after its own library_dirs, and a Python built as a shared library
# (Debian's python3, so the image's) adds its LIBDIR there: /usr/lib/x86_64-linux-gnu.
# There -lfuse3 finds the system's libfuse3.so (libfuse3-dev, 3.14: libfuse3.so.3) before
# ours, and the module, compiled against 3.17's headers, is linked to 3.14 and cannot load
# (undefined symbol: fuse_session_new_versioned).  LDFLAGS come first on the link line.
PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" LDFLAGS="-L$PREFIX/lib -Wl,-rpath,$PREFIX/lib" \
  "$PY" -m pip install -q --force-reinstall --no-deps "$src" || fail "cannot build the patched pyfuse3"
# The module is the patched one, finds this libfuse and loads.
so=$(pyfuse3_so) || fail "the patched pyfuse3 is not installed"
grep -q session_fd_number "$so" || fail "the installed pyfuse3 is not the patched one"
# (ldd's output taken whole: `ldd | grep -q` under pipefail fails when grep exits first)
libs=$(ldd "$so") || fail "ldd cannot read $so"
[[ $libs == *"$PREFIX/lib/libfuse3.so"* ]] \
  || fail "the patched pyfuse3 does not load libfuse from $PREFIX ($(grep -o 'libfuse3[^ ]* => [^ ]*' <<<"$libs" || echo 'no libfuse3'))"
loaded=$(pyfuse3_loads 2>&1) || fail "the patched $(tail -n 1 <<<"$loaded")"
echo "build-pyfuse3: $loaded"
