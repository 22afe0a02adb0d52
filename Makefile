# Two commands do all set-up on a fresh Debian machine (as root):
#   make run   - install everything, start 1 master + 2 workers (+ the mount) under ./.curvine, until Ctrl-C
#   make test  - install everything and run the whole suite
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
APT_PKGS := fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv iproute2 util-linux curl patch acl
# MooseFS: the peer bench/compare (and tests/multihost/test_compare.py) measures us against.
PEER_PKGS := moosefs-master moosefs-chunkserver moosefs-client
STAMP := $(VENV)/.installed
# mypy ([tool.mypy] in pyproject.toml) sees master/, worker/ and fuse/ as the curvine_py.master,
# .worker and .fuse they install as through links here (it cannot follow the editable install's
# import hook); sed gives the paths it prints back as the folders' own.
MYPY_LINKS := $(VENV)/mypy-path/curvine_py

.PHONY: run test install bytecode system-deps peer-deps lmcache-deps proto bench compare clean image fuzz

# ARGS: more `cv cluster start` flags, e.g. make run ARGS="--master-port 18995 --base-port 19000"
run: install bytecode
	$(VENV)/bin/cv cluster start --dir .curvine --workers 2 --mount mnt --foreground $(ARGS)

test: install peer-deps lmcache-deps bytecode
	$(VENV)/bin/ruff check curvine_py master worker fuse tests bench bench/compare fuzz
	@mkdir -p $(MYPY_LINKS) && for d in master worker fuse; do ln -sfn ../../../$$d $(MYPY_LINKS)/$$d; done
	set -o pipefail; $(VENV)/bin/mypy | sed 's,^$(MYPY_LINKS)/,,'
	$(PY) -m pytest -q tests

install: $(STAMP)

# The project's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as in some CI
# images) no process writes it, and every daemon and `cv` command compiled the whole project
# from source at its start (~0.1 s of CPU each; the suite starts thousands of them).
# Up-to-date files are skipped; a changed source makes its .pyc stale (checked by mtime).
bytecode: install
	$(PY) -m compileall -q curvine_py master worker fuse

# Nothing optional stops the install: deploy/build-pyfuse3.sh falls back to PyPI's pyfuse3
# (no FUSE passthrough, 1 MiB requests) with one warning; the io_uring binding is built in
# a step of its own that, when it cannot build (no compiler, offline), leaves none behind
# (a wheel compiled for another CPU would kill the workers with SIGILL) and says so once.
$(STAMP): pyproject.toml deploy/build-pyfuse3.sh deploy/pyfuse3.patch | system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	bash deploy/build-pyfuse3.sh $(VENV)
	@if $(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('pyfuse3') is None)"; then \
	  extras=fuse,dev; else extras=dev; fi; \
	  echo "$(PY) -m pip install -q -e '.[$$extras]'"; $(PY) -m pip install -q -e ".[$$extras]"
	@$(PY) -c "import pyfuse3; pyfuse3.session_fd_number" 2>/dev/null || test -e $(VENV)/opt/pyfuse3-stock \
	  || echo "warning: pyfuse3 lacks deploy/pyfuse3.patch: FUSE passthrough and 4 MiB requests are off" >&2
	@echo "$(PY) -m pip install -q -e '.[uring]'  (log: $(VENV)/uring-build.log)"; \
	  $(PY) -m pip install -q -e '.[uring]' >$(VENV)/uring-build.log 2>&1 || { \
	    $(PY) -m pip uninstall -q -y liburing >>$(VENV)/uring-build.log 2>&1; \
	    echo "warning: io_uring binding not built: workers use the thread engine (log: $(VENV)/uring-build.log)" >&2; }
	touch $(STAMP)

# The container image curvine-py:VERSION (deploy/container/Containerfile) with buildah or
# podman, installed from apt when neither is; from debian:bookworm-slim when a registry is
# reachable, else from a local debootstrap base (deploy/build-image.sh).  TAG=name:tag to name it.
image:
	bash deploy/build-image.sh $(TAG)

# Debian packages the mount needs (fusermount3 to mount; a compiler, curl and patch to build
# libfuse 3.17 and pyfuse3 with passthrough, see deploy/build-pyfuse3.sh; acl: setfacl and getfacl for
# the ACL tests; the compiler also
# builds the io_uring binding, liburing, from its source for this machine's CPU).
system-deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v python3 >/dev/null || (apt-get update -qq && apt-get install -y -qq python3 python3-venv)

peer-deps:
	@missing=""; for p in $(PEER_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	    || echo "warning: could not install$$missing (bench/compare and its test will be skipped)"; \
	fi

# Real LMCache for the KV tests (tests/kvclients/lmcache_driver.py, tests/multihost/test_lmcache.py):
# a venv of its own at .venv/lmcache (torch 2.13.0 CPU; LMCache 0.5.6 without its requirements,
# which pull CUDA builds; what its CPU path imports), ~1.5 GB, a few minutes the first time;
# and this checkout without its dependencies (LMCache loads curvine_py.kv.lmcache, docs/kvcache.md),
# with the few the SDK imports pinned in the requirements file.
# Optional: where it cannot be installed (offline), those tests skip and say why.
LMCACHE_VENV := $(VENV)/lmcache
LMCACHE_LOG := $(VENV)/lmcache-install.log
lmcache-deps: $(LMCACHE_VENV)/.installed

$(LMCACHE_VENV)/.installed: tests/kvclients/lmcache-requirements.txt | install
	@echo "installing real LMCache 0.5.6 into $(LMCACHE_VENV) (log: $(LMCACHE_LOG))"
	@{ test -x $(LMCACHE_VENV)/bin/python || python3 -m venv $(LMCACHE_VENV); } >$(LMCACHE_LOG) 2>&1 \
	  && $(LMCACHE_VENV)/bin/pip install -q torch==2.13.0 >>$(LMCACHE_LOG) 2>&1 \
	  && $(LMCACHE_VENV)/bin/pip install -q --no-deps lmcache==0.5.6 >>$(LMCACHE_LOG) 2>&1 \
	  && $(LMCACHE_VENV)/bin/pip install -q -r tests/kvclients/lmcache-requirements.txt >>$(LMCACHE_LOG) 2>&1 \
	  && $(LMCACHE_VENV)/bin/pip install -q --no-deps -e . >>$(LMCACHE_LOG) 2>&1 \
	  && touch $@ \
	  || echo "warning: real LMCache could not be installed: its tests skip (log: $(LMCACHE_LOG))" >&2

# Coverage-guided fuzzing (fuzz/, docs/testing.md "Fuzzing"): each target under atheris for
# FUZZ_SECONDS, then one table of executions and crashes (inputs under .fuzz/<target>/).
# atheris (the [fuzz] extra) is installed here, not by make install or make test.
FUZZ_SECONDS ?= 60
fuzz: install
	@$(PY) -m pip install -q -e '.[fuzz]' >$(VENV)/fuzz-install.log 2>&1 || { \
	  echo "make fuzz: atheris could not be installed on this machine (no wheel for this Python, no compiler?); log: $(VENV)/fuzz-install.log" >&2; \
	  exit 1; }
	$(PY) -m fuzz.run_all --seconds $(FUZZ_SECONDS)

# Regenerate the protobuf/gRPC code in curvine_py/pb from proto/ (never edit it by hand).
proto:
	$(PY) -m grpc_tools.protoc -Icurvine_py/pb=proto --python_out=. --grpc_python_out=. --pyi_out=. proto/curvine.proto proto/data.proto proto/csi.proto
	$(PY) proto/gen_methods.py

bench: install
	$(PY) bench/sdk_bench.py

# Ours vs MooseFS vs a local directory on 3 network-namespace hosts (root), one table;
# then the UFS smoke run (SeaweedFS on loopback vs OpenDAL's own GETs, ~20 s; bench/ufs_bench.py).
compare: install peer-deps
	$(PY) bench/compare
	$(PY) bench/ufs_bench.py --quick

clean:
	-$(VENV)/bin/cv cluster stop --dir .curvine
	rm -rf .curvine
