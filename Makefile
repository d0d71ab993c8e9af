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

.PHONY: install test test-all typecheck api compat compat-jax test-torchtitan test-multinode fuzz demo bench docs clean FORCE

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

# Two tiers (README "Test"; tests/conftest.py marks the slow tests). `make test`, the fast tier: unit
# tables, laws, the oracle against torch, the fake backend, fuzz (CI profile), the doctests, and one real
# gloo check per family (realize, collectives, shard_map, ragged). `make test-all`, what CI runs: every
# test, the slow ones too (gloo worlds, examples, faults, compiles, the JAX oracle, two hosts).
test: $(STAMP) typecheck
	$(PY) -m pytest -q -m "not slow"

# mypy (pinned in the "test" extra) over the package, as pyproject.toml's [tool.mypy] says: strict on the
# pure layers, torch read as Any, the looser places listed there with their reasons (docs/design.md, "Types
# checked"). ~2 s with its cache (.mypy_cache), ~25 s without one (the standard library's stubs read once).
typecheck: $(STAMP)
	$(PY) -m mypy

test-all: $(STAMP) typecheck
	$(PY) -m pytest -q

# The compatibility pass for another torch (.ci/run: `make compat TORCH=2.11.0`, the oldest we support; README
# "Which tier for which torch"): every test file that imports torch -- the oracle vs torch's DeviceMesh, the
# fake backend, real gloo workers, two hosts, the examples, unit tables (shard_map's aten op table), fuzz,
# purity; both tiers of them. Left out: the laws, the import layers and the doctests, which check the pure
# layer and import no torch (~5 s); and the JAX oracle, which judges our semantics against JAX's once, in
# make test-all (its 170 programs cost ~4 min more per torch on two cores; `make compat-jax TORCH=...` runs it).
COMPAT_TESTS := tests/oracle tests/fake tests/dist tests/multinode tests/unit tests/fuzz \
	tests/test_purity.py tests/test_examples.py tests/test_examples_dist.py
compat: $(STAMP)
	$(PY) -m pytest -q $(COMPAT_TESTS)

compat-jax: $(STAMP)
	$(PY) -m pytest -q tests/jax_oracle

# The torchtitan suite (tests/torchtitan, docs/torchtitan.md): torchtitan 0.3.0's own ParallelDims, and
# llama3 and deepseek_v3 training, against ours. Its own venv per torch, since torchtitan's dependencies are
# not ours: .venv-titan for 2.13.0, .venv-titan-$(TORCH) for any other (`make test-torchtitan TORCH=2.14.1`).
# FM_TITAN_CASES=a,b picks the training cases (default all; spmd_types skips where FSDP2 does not read its annotations: torch 2.13).
TITAN_VENV  := $(if $(filter 2.13.0,$(TORCH)),.venv-titan,.venv-titan-$(TORCH))
TITAN_PY    := $(TITAN_VENV)/bin/python
TITAN_STAMP := $(TITAN_VENV)/.installed
# torchtitan and the packages it imports by name, --no-deps: its declared dependencies pull more than it
# imports (wandb, an unpinned torch through torchdata). triton: torchtitan.models imports it
# (distributed/minimal_async_ep/kernels.py); the 2.13.0 CPU build brings none, CUDA builds their own.
TITAN_NODEPS := torchtitan==0.3.0 spmd_types==0.2.3 torchdata==0.11.0 $(if $(filter 2.13.0,$(TORCH)),triton==3.7.0)
# What torchtitan imports on the tests' and the example's path, pinned, under the torch constraint:
# torchtitan.trainer (which its model configs import) pulls all five. Its other dependencies (einops,
# safetensors, torch_checkpointing, wandb) are imported by none of it.
TITAN_DEPS := tyro==1.0.17 tensorboard==2.21.0 pillow==13.0.0 datasets==4.7.0 tokenizers==0.23.3
# The stamp holds the whole pinned set: a venv whose stamp says otherwise is brought up to date.
TITAN_SPEC := $(strip torch==$(TORCH) $(TITAN_NODEPS) $(TITAN_DEPS))
ifneq ($(strip $(shell cat $(TITAN_STAMP) 2>/dev/null)),$(TITAN_SPEC))
$(TITAN_STAMP): FORCE
endif

$(TITAN_STAMP): pyproject.toml
	test -x $(TITAN_PY) || $(PYTHON) -m venv $(TITAN_VENV)
	$(TITAN_PY) -m pip install --quiet --upgrade pip
	# torch first and pinned, then everything else under a constraint that keeps it (as for the main venv).
	$(TITAN_PY) -m pip install --quiet torch==$(TORCH)
	echo "torch==$(TORCH)" > $(TITAN_VENV)/constraints.txt
	$(TITAN_PY) -m pip install --quiet -c $(TITAN_VENV)/constraints.txt -e ".[test]"
	$(TITAN_PY) -m pip install --quiet -c $(TITAN_VENV)/constraints.txt $(TITAN_DEPS)
	$(TITAN_PY) -m pip install --quiet --no-deps $(TITAN_NODEPS)
	$(TITAN_PY) -c 'import sys, torch; v = torch.__version__; sys.exit(0 if v.split("+")[0] == "$(TORCH)" else f"$(TITAN_VENV) has torch {v}, not $(TORCH)")'
	# tests/torchtitan skips when torchtitan does not import: here that is an error, with the reason.
	$(TITAN_PY) -c 'import torchtitan.trainer, torchtitan.models.llama3, torchtitan.distributed.spmd_types'
	echo "$(TITAN_SPEC)" > $(TITAN_STAMP)

# tests/test_examples.py: examples/torchtitan_llama3.py trains there (8 workers; spmd_types from torch 2.14 on).
TITAN_TESTS := tests/torchtitan tests/test_examples.py
test-torchtitan: $(TITAN_STAMP)
	$(if $(FM_TITAN_CASES),FM_TITAN_CASES=$(FM_TITAN_CASES)) $(TITAN_PY) -m pytest -q $(TITAN_TESTS)

# Two torchrun agents on this machine as two hosts of 4 ranks (c10d rendezvous on loopback):
# realize, collectives and Mesh.host_span against the real hosts. Also part of `make test-all`.
test-multinode: $(STAMP)
	$(PY) -m pytest -q tests/multinode

# Fuzz every public entry point (tests/fuzz) with bad values and types, valid ones mixed in, under the
# large hypothesis profile: 500 examples per entry point, over 10,000 calls in all (the total is printed).
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q tests/fuzz

# The main example (README, make demo): 3-D mesh, FSDP2 + TP, losses checked against one process.
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
	$(PY) benchmarks/bench_overlap.py --out benchmarks/results/overlap.jsonl
	$(PY) benchmarks/bench_moe.py --out benchmarks/results/moe.jsonl
	$(PY) benchmarks/bench_eager.py --out benchmarks/results/eager.jsonl
	$(PY) benchmarks/bench_shard_map.py --out benchmarks/results/shard_map.jsonl
	$(PY) benchmarks/bench_compile.py --out benchmarks/results/compile.jsonl
	# torchtitan's ParallelDims against ours: in the torchtitan venv when it exists (make test-torchtitan), else skipped
	$(if $(wildcard .venv-titan/bin/python),.venv-titan/bin/python,$(PY)) benchmarks/bench_torchtitan.py \
		--out benchmarks/results/torchtitan.jsonl
	$(PY) benchmarks/_report.py benchmarks/results/transforms.jsonl benchmarks/results/realize.jsonl \
		benchmarks/results/collectives.jsonl benchmarks/results/overlap.jsonl benchmarks/results/eager.jsonl \
		benchmarks/results/moe.jsonl \
		benchmarks/results/shard_map.jsonl benchmarks/results/compile.jsonl benchmarks/results/torchtitan.jsonl --docs docs/benchmarks.md

# docs/api.md's index, generated from the docstrings below the page's hand-written head (tests/unit/test_api_index.py
# fails when it is stale). tools/doc_lines.py prints how much of the package is docstring.
api: $(STAMP)
	$(PY) tools/gen_api.py

# Optional: a static site of docs/ with mkdocs (the "docs" extra); every page is also doctested by make test.
docs: $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(TITAN_VENV) .pytest_cache .hypothesis .mypy_cache *.egg-info site

# The GPU smoke run (tests/gpu/run.py, docs/reliability.md): realize, every collective, DTensor, shard_map,
# torch.compile (inductor), FSDP2 + TP and abort on CUDA, each against one process; NCCL at world 1, 4
# processes on gloo sharing the GPU, NCCL across GPUs when there are 2 or more. Before a gloo job a torch-only
# probe tries torch's functional collectives there; where they crash (torch 2.11.0 with CUDA tensors), the
# checks that need them skip, saying so (docs/gpu.md). It uses the machine's own python and torch (2.11 or
# newer) and installs nothing; without a GPU it says so and exits 0.
GPU_PYTHON ?= python3
.PHONY: gpu-smoke
gpu-smoke:
	PYTHONPATH=. $(GPU_PYTHON) tests/gpu/run.py

# The accelerate suite (tests/accelerate, docs/accelerate.md): accelerate 1.15.0's ParallelismConfig meshes
# against ours. Its own venv per torch, like torchtitan's: .venv-accelerate for 2.13.0,
# .venv-accelerate-$(TORCH) for any other (`make test-accelerate TORCH=2.14.1`); torch pinned first, then
# this package, then accelerate and what it imports, pinned, under the torch constraint.
ACC_VENV  := $(if $(filter 2.13.0,$(TORCH)),.venv-accelerate,.venv-accelerate-$(TORCH))
ACC_PY    := $(ACC_VENV)/bin/python
ACC_STAMP := $(ACC_VENV)/.installed
ACC_PINS  := accelerate==1.15.0 huggingface_hub==1.33.0 safetensors==0.8.0 psutil==7.2.2 pyyaml==6.0.3 packaging==26.0
ACC_SPEC  := $(strip torch==$(TORCH) $(ACC_PINS))
ifneq ($(strip $(shell cat $(ACC_STAMP) 2>/dev/null)),$(ACC_SPEC))
$(ACC_STAMP): FORCE
endif

$(ACC_STAMP): pyproject.toml
	test -x $(ACC_PY) || $(PYTHON) -m venv $(ACC_VENV)
	$(ACC_PY) -m pip install --quiet --upgrade pip
	$(ACC_PY) -m pip install --quiet torch==$(TORCH)
	echo "torch==$(TORCH)" > $(ACC_VENV)/constraints.txt
	$(ACC_PY) -m pip install --quiet -c $(ACC_VENV)/constraints.txt -e ".[test]"
	$(ACC_PY) -m pip install --quiet -c $(ACC_VENV)/constraints.txt $(ACC_PINS)
	$(ACC_PY) -c 'import sys, torch; v = torch.__version__; sys.exit(0 if v.split("+")[0] == "$(TORCH)" else f"$(ACC_VENV) has torch {v}, not $(TORCH)")'
	$(ACC_PY) -c 'import accelerate, accelerate.parallelism_config; assert accelerate.__version__ == "1.15.0", accelerate.__version__'
	echo "$(ACC_SPEC)" > $(ACC_STAMP)

.PHONY: test-accelerate
test-accelerate: $(ACC_STAMP)
	$(ACC_PY) -m pytest -q tests/accelerate
