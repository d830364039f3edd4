# The two commands a fresh machine needs (see README.md):
#   make demo   -- install everything, then run the end-to-end demo on the shared assets
#   make test   -- install everything, then run ruff and the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= all,dev
# the suite's workers (pytest-xdist, one module each at a time): most tests wait on brokers, agents and browsers, so
# more workers than CI's 2 cores; `make test TEST_WORKERS=0` runs it in one process
TEST_WORKERS ?= 4
export EDGEINFER_ASSETS ?= $(abspath ../shared/assets)
# the tracker (edgeinfer[tracking]) without the opencv-python, matplotlib and PyAV `trackers` declares but
# ByteTrack does not import: a second cv2 over opencv-python-headless would be a bad idea (docs/analytics.md)
TRACKING_DEPS := scipy "pydeprecate>=0.9,<0.14" rich requests defusedxml tqdm pillow pyyaml
TRACKING_NO_DEPS := "trackers>=2.6,<3" "supervision>=0.26"

.PHONY: demo test lint bench system-deps venv clean

demo: venv
	$(BIN)/edgeinfer demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

lint: venv
	$(BIN)/ruff check .

bench: venv
	$(BIN)/python bench/engine_overhead.py

# The pipeline against a tutorial loop, invoke alone and decode alone (docs/benchmarks.md, "Pipeline").
.PHONY: bench-pipeline
bench-pipeline: venv
	$(BIN)/python bench/pipeline.py

# edgeinfer run against a 40-line OpenCV + ONNX Runtime loop and Ultralytics' predict on the same YOLO ONNX files
# (docs/benchmarks.md, "Peers"); Ultralytics runs from a bench-only environment: `make bench-peers-setup` makes it.
PEERS_ARGS ?=
.PHONY: bench-peers bench-peers-setup
bench-peers: venv
	$(BIN)/python bench/peers.py $(PEERS_ARGS)

bench-peers-setup: venv
	$(BIN)/python bench/peers.py --setup-ultralytics

# A live MJPEG camera under the latest policy: frames dropped compressed vs OpenCV decoding them all.
.PHONY: bench-live
bench-live: venv
	$(BIN)/python bench/live_decode.py

# aarch64 under emulation (docs/hardware.md): this tree's wheel checked inside a Debian bookworm arm64 userland
# that debootstrap + qemu-user-static (binfmt_misc) build once under $(ARM64_CACHE); a later run reuses it.
# Needs root; correctness only (no speed figures from an emulator); not part of `make test` / CI.
ARM64_CACHE ?= build/arm64
.PHONY: test-arm64
test-arm64: venv
	$(BIN)/python tests/arm64/harness.py --cache $(ARM64_CACHE)

# Debian packages the demo and the tests use (a real Mosquitto broker, PostgreSQL that the fleet tests start
# in a temporary directory, mosquitto-clients for the ingest benchmark's baseline, shellcheck for the
# provisioning scripts, Prometheus to run the Grafana dashboard's queries, Chromium and its chromedriver for
# the fleet dashboard's browser tests, driven by Selenium at /usr/bin/chromium and /usr/bin/chromedriver;
# gst-rtsp-server under Debian's python3 with the x264/x265 encoders for the RTSP cameras of tests/capture).
# Installed only when missing; needs root, as on CI.
system-deps:
	@missing=""; \
	command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing="$$missing mosquitto"; \
	command -v shellcheck >/dev/null 2>&1 || missing="$$missing shellcheck"; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v mosquitto_sub >/dev/null 2>&1 || missing="$$missing mosquitto-clients"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/chromedriver ] || missing="$$missing chromium-driver"; \
	/usr/bin/python3 -c "import gi; gi.require_version('GstRtspServer', '1.0')" >/dev/null 2>&1 \
	  || missing="$$missing python3-gi gir1.2-gst-rtsp-server-1.0"; \
	command -v gst-inspect-1.0 >/dev/null 2>&1 || missing="$$missing gstreamer1.0-tools"; \
	gst-inspect-1.0 --exists videotestsrc 2>/dev/null || missing="$$missing gstreamer1.0-plugins-base"; \
	gst-inspect-1.0 --exists rtph265pay 2>/dev/null || missing="$$missing gstreamer1.0-plugins-good"; \
	gst-inspect-1.0 --exists x264enc 2>/dev/null || missing="$$missing gstreamer1.0-plugins-ugly"; \
	gst-inspect-1.0 --exists x265enc 2>/dev/null || missing="$$missing gstreamer1.0-plugins-bad"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: system-deps $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install -q $(TRACKING_DEPS)
	$(BIN)/python -m pip install -q --no-deps $(TRACKING_NO_DEPS)
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info .edgeinfer-demo
