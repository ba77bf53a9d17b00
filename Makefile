# The two-command set-up (README.md): `make demo` runs the main job, `make test`
# runs every CPU test. Both install what is missing first (scripts/install_deps.sh).
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
SAMPLE_CONFIG ?= samples/configs/deepseek_v3_tiny.json
SAMPLE ?= $(BUILD)/sample-deepseek_v3
PROMPT ?= 0,64,128,7,19,222,45,8
TOKENS ?= 16

.PHONY: all deps build demo test clean

all: build

deps:
	@bash scripts/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	@test -f $(SAMPLE)/model.safetensors || $(BUILD)/moec-sample $(SAMPLE_CONFIG) $(SAMPLE)
	$(BUILD)/moec dump-ir $(SAMPLE) --summary
	$(BUILD)/moec run $(SAMPLE) --prompt-ids $(PROMPT) --max-new-tokens $(TOKENS) --ignore-eos

test: build
	cd $(BUILD) && ctest -L cpu --output-on-failure -j$(JOBS)

clean:
	rm -rf $(BUILD)
