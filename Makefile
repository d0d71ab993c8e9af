# Every target works on a fresh clone with only Python 3.11: it creates the venv first.
# TORCH picks the torch release (pinned, `torch==$(TORCH)`) and so the venv: .venv for the default
# 2.13.0 (a CPU build, seconds from local disk), .venv-torch-$(TORCH) for any other, e.g.
# `make test TORCH=2.14.1` (a CUDA build that runs on CPU, ~5.5 GB venv, its own directory).
PYTHON ?= python3
TORCH  ?= 2.13.0
VENV   := $(if $(filter 2.13.0,$(TORCH)),.venv,.venv-torch-$(TORCH))
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

export OMP_NUM_THREADS := 1

.PHONY: install test compat test-multinode fuzz demo bench docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned, so pip never resolves an unpinned (CUDA, multi-GB) torch; the
	# constraint keeps `torch>=2.13` of the package satisfied by that torch and no other.
	$(PY) -m pip install --quiet torch==$(TORCH)
	echo "torch==$(TORCH)" > $(VENV)/constraints.txt
	$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e ".[test]"
	$(PY) -c 'import sys, torch; v = torch.__version__; sys.exit(0 if v.split("+")[0] == "$(TORCH)" else f"$(VENV) has torch {v}, not $(TORCH)")'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# The compatibility pass for a second torch (.ci/run: `make compat TORCH=2.14.1`): every test file that
# imports torch -- the oracle vs torch's DeviceMesh, the fake backend, real gloo workers, the JAX oracle,
# two hosts, the examples, unit tables (shard_map's aten op table), fuzz, purity. Left out: the laws,
# the import floors and the doctests, which check the pure layer and import no torch (~5 s of `make test`).
COMPAT_TESTS := tests/oracle tests/fake tests/dist tests/jax_oracle tests/multinode tests/unit tests/fuzz \
	tests/test_purity.py tests/test_examples.py tests/test_examples_dist.py
compat: $(STAMP)
	$(PY) -m pytest -q $(COMPAT_TESTS)

# Two torchrun agents on this machine as two hosts of 4 ranks (c10d rendezvous on loopback):
# realize, collectives and Mesh.host_span against the real hosts. Also part of `make test`.
test-multinode: $(STAMP)
	$(PY) -m pytest -q tests/multinode

# Fuzz every public entry point (tests/fuzz) with bad values and types, valid ones mixed in, under the
# large hypothesis profile: 500 examples per entry point, over 10,000 calls in all (the total is printed).
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q tests/fuzz

# The main example (DESIGN.md §8): 3-D mesh, FSDP2 + TP, losses checked against one process.
# NPROC workers (default 8): gloo on CPU when no GPU is present, NCCL on GPUs.
NPROC ?= 8
demo: $(STAMP)
	$(PY) -m torch.distributed.run --standalone --nproc_per_node=$(NPROC) examples/train_3d.py

# Records (JSON lines) go to benchmarks/results/; _report.py renders them into docs/benchmarks.md.
# `make bench BEFORE=<root>` also times the pure operations with the package under <root>.
bench: $(STAMP)
	$(PY) benchmarks/bench_transforms.py $(if $(BEFORE),--before $(BEFORE)) --out benchmarks/results/transforms.jsonl
	$(PY) benchmarks/bench_realize.py --out benchmarks/results/realize.jsonl
	$(PY) benchmarks/bench_collectives.py --out benchmarks/results/collectives.jsonl
	$(PY) benchmarks/_report.py benchmarks/results/transforms.jsonl benchmarks/results/realize.jsonl \
		benchmarks/results/collectives.jsonl --docs docs/benchmarks.md

# Optional: a static site of docs/ with mkdocs (the "docs" extra); every page is also doctested by make test.
docs: $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info site
