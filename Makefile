# Every target sets itself up: a .venv is created if missing and the package installed into it
# (editable, with the mpi, test, privacy, tracking and docs extras) under constraints.txt, which pins the CPU torch wheel.
PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
NP     ?= 8
# mpiexec from the mpich wheel lives in the venv; put it first on PATH so ranks find the same python.
export PATH := $(BIN):$(PATH)
export OMP_NUM_THREADS ?= 1
# Python caches compiled modules (__pycache__, git-ignored) and pytest its rewritten test files: an
# environment that turns this off (PYTHONDONTWRITEBYTECODE) has every process of the suite compile
# the package again (0.45 s of the 4 s a DP training process spends importing) and pytest rewrite
# every test file again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install lint test demo docs clean iproute2

install: $(STAMP) iproute2

# The emulated cluster (python -m gossip_powersgd.cluster, tests/cluster/test_network.py) drives iproute2's
# ip and tc: installed with apt-get where missing and this is root (CI: a fresh Debian machine);
# elsewhere a note, and the cluster tests skip without root or fail naming what is missing.
iproute2:
	@command -v ip >/dev/null && command -v tc >/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2; \
	  else echo "note: ip/tc (iproute2) missing and not installable here (apt-get as root)"; fi; }

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[mpi,test,privacy,tracking,docs]'
	touch $(STAMP)

# ruff's checks as configured in pyproject.toml (pyflakes and pycodestyle's error classes), and
# the format check (the tree is `ruff format`ted; run `$(BIN)/ruff format .` before committing).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The suite in two parts, side by side: the independent tests on $(TEST_WORKERS) workers
# (pytest-xdist, a worker taking another's queued tests when it runs out) at a lower priority
# (nice 10), and the tests marked `timing` (a detection or response time checked against the
# design's bound, a timeout of seconds, a run paced on the clock) one at a time at the usual
# priority: they wait far more than they compute (about 170 CPU-seconds in 510 s), so the CPU is
# theirs the moment they need it, and the others use the rest. Three workers on two cores: many
# tests wait too (a launch, a fault found), and a third keeps the cores busy meanwhile (2 quiet
# cores: 655 s with two, 619 s with three). The timing tests' output follows the others'. Both
# run; either failing fails.
TEST_WORKERS ?= 3
test: $(STAMP) iproute2
	status=0; timing_log=$$(mktemp); \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=60 -m timing > $$timing_log 2>&1 & \
	timing=$$!; \
	nice -n 10 $(BIN)/python -m pytest -q --durations=60 -n $(TEST_WORKERS) --dist worksteal -m "not timing" || status=1; \
	wait $$timing || status=1; \
	echo "---- the tests marked timing (run beside the others, one at a time) ----"; \
	cat $$timing_log; rm -f $$timing_log; \
	exit $$status

# The main job: 8 peers on a ring under mpiexec, MNIST-1D, a CNN, PowerGossip rank 1; prints the
# summary table and writes the plots. Each run gets its own directory under runs/. The programs are
# the library's (gossip-train, gossip-plot), run as modules so that every rank uses the venv's python.
demo: $(STAMP)
	@run=runs/demo-$$(date +%Y%m%d-%H%M%S); \
	$(BIN)/mpiexec -n $(NP) $(BIN)/python -m gossip_powersgd.cli.train \
		--config experiments/configs/demo.yaml --set out_dir=$$run && \
	$(BIN)/python -m gossip_powersgd.cli.plot $$run --out $$run/plots

# The documentation site (docs/): Sphinx with warnings as errors; the tutorials (docs/examples/) and
# the pages' doctest blocks run as it builds. Offline: nothing is fetched. Open docs/_build/html/index.html.
docs: $(STAMP)
	rm -rf docs/tutorials docs/_build  # every tutorial runs again, on the code as it is
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	$(BIN)/python -m sphinx -W --keep-going -q -b doctest -D plot_gallery=0 docs docs/_build/doctest

clean:
	rm -rf $(VENV) build *.egg-info docs/_build docs/tutorials docs/sg_execution_times.rst
