"""Delegate selection: plans on fake device roots, real runs through selection, strict mode,
the Edge TPU model's CPU twin, third-party delegates, and the GPU delegates' reasons here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.assets import IMAGES, LABELS, MODELS, REFERENCE_TOP1, REPO
from support.profiles import FakeRoot, fake_root, write_profile

import edgeinfer
from edgeinfer.errors import DelegateUnavailable, NoDelegateAvailable, ProfileError
from edgeinfer.pipeline.classify import ImageClassifier
from edgeinfer.pipeline.labels import Labels
from edgeinfer.pipeline.postprocess import class_scores
from edgeinfer.runtime.delegates.registry import BUILTIN_DELEGATES, delegate_names, get_delegate
from edgeinfer.runtime.delegates.tensorrt import TensorRTOptions, cache_key, cache_path
from edgeinfer.runtime.selection import DELEGATE_ENV, STRICT_ENV, load, plan

TFLITE = MODELS / "mobilenet_v2_1.0_224_quant.tflite"
ONNX = MODELS / "mobilenet_v2_1.0_224_quant.onnx"
EDGETPU = MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"
TWIN = MODELS / "mobilenet_v1_0.25_128_quant.tflite"
NO_ENV: dict[str, str] = {}
LIBEDGETPU_DIR = "/usr/lib/aarch64-linux-gnu"


@pytest.fixture(scope="module")
def labels() -> Labels:
    return Labels.load(LABELS / "imagenet_labels.txt")


def pi4_coral(tmp_path: Path, *, libedgetpu: bool) -> FakeRoot:
    root = fake_root(tmp_path / "pi4-coral", "raspberry-pi-4-coral-usb")
    return root.library("libedgetpu.so.1.0", LIBEDGETPU_DIR) if libedgetpu else root


def assert_reference_top1(engine, labels, images=REFERENCE_TOP1) -> None:
    classifier = ImageClassifier(engine, labels, top_k=1)
    for image, (label, _score) in images.items():
        top = classifier.classify_file(IMAGES / image)
        assert top[0].label.startswith(label), (engine.description, image, top)


# ---------------------------------------------------------------------------------- plans

def test_pi4_coral_with_libedgetpu_plans_coral(tmp_path):
    root = pi4_coral(tmp_path, libedgetpu=True)
    for model in (None, EDGETPU):
        the_plan = plan(model, root=root, env=NO_ENV)
        assert the_plan.profile == "raspberry-pi-4-coral-usb"
        assert the_plan.chosen.name == "coral" and the_plan.chosen.device == "usb"
        assert the_plan.fallback_reason is None and not the_plan.is_fallback
        assert the_plan.threads is None  # the thread plan decides (device/cores.py)


def test_pi4_coral_without_libedgetpu_plans_xnnpack_and_names_libedgetpu(tmp_path):
    the_plan = plan(root=pi4_coral(tmp_path, libedgetpu=False), env=NO_ENV)
    coral = the_plan.candidates[0]
    assert coral.name == "coral" and not coral.available and "libedgetpu.so.1" in coral.reason
    assert "setup-pi.sh" in coral.reason
    assert the_plan.chosen.name == "xnnpack"
    assert the_plan.is_fallback and "libedgetpu" in the_plan.fallback_reason


def test_pi4_coral_without_the_accelerator_says_so(tmp_path):
    root = fake_root(tmp_path, "raspberry-pi-4").library("libedgetpu.so.1.0", LIBEDGETPU_DIR)
    the_plan = plan(root=root, profile="raspberry-pi-4-coral-usb", env=NO_ENV)
    assert "no Coral USB Accelerator found" in the_plan.candidates[0].reason
    assert "libedgetpu" not in the_plan.candidates[0].reason


def test_plain_tflite_on_a_coral_device_is_filtered_not_a_fallback(tmp_path):
    the_plan = plan(TFLITE, root=pi4_coral(tmp_path, libedgetpu=True), env=NO_ENV)
    coral = the_plan.candidates[0]
    assert not coral.compatible and "not compiled for the Edge TPU" in coral.reason
    assert the_plan.chosen.name == "xnnpack" and not the_plan.is_fallback and the_plan.fallback_reason is None


@pytest.mark.parametrize("profile", ["jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin"])
def test_jetson_orin_plans_tensorrt_first(profile, tmp_path):
    the_plan = plan(ONNX, root=fake_root(tmp_path, profile), env=NO_ENV)
    assert the_plan.profile == profile
    first = the_plan.candidates[0]
    assert first.name == "tensorrt" and first.device == "fp16" and first.compatible
    assert not first.available and "tensorrt" in first.reason  # no TensorRT Python module on this machine
    assert [c.name for c in the_plan.candidates][:2] == ["tensorrt", "tensorrt" if "agx" in profile
                                                         else "onnxruntime-gpu"]
    assert the_plan.chosen.name == "onnxruntime"
    assert the_plan.fallback_reason.startswith("tensorrt:fp16: ")


def test_jetson_root_without_tensorrt_libraries_says_so(tmp_path):
    root = FakeRoot(tmp_path).cpu("aarch64").model("NVIDIA Jetson Orin Nano Developer Kit").tegra(36, "4.0")
    reason = plan(ONNX, root=root, env=NO_ENV).candidates[0].reason
    assert "libnvinfer" in reason and "setup-jetson.sh" in reason


def test_ncs2_plans_openvino(tmp_path):
    the_plan = plan(ONNX, root=fake_root(tmp_path, "x86-64-ncs2"), env=NO_ENV)
    myriad = the_plan.candidates[0]
    assert (myriad.name, myriad.device) == ("openvino", "MYRIAD")
    assert not myriad.available and "no MYRIAD plugin" in myriad.reason and "2022.3" in myriad.reason
    assert (the_plan.chosen.name, the_plan.chosen.device) == ("openvino", "CPU")


def test_core_ultra_without_npu_driver_plans_openvino_cpu(tmp_path):
    root = FakeRoot(tmp_path).cpu("x86_64", "Intel(R) Core(TM) Ultra 5 125U")
    the_plan = plan(TFLITE, root=root, env=NO_ENV)
    assert the_plan.profile == "intel-core-ultra-npu"
    reasons = {c.spec: c.reason for c in the_plan.candidates}
    assert "/dev/accel/accel" in reasons["openvino:NPU"] and "/dev/dri/renderD" in reasons["openvino:GPU"]
    assert the_plan.chosen.spec == "openvino:CPU"


def test_plan_lists_every_registered_delegate_for_the_cli(tmp_path):
    the_plan = plan(root=fake_root(tmp_path, "raspberry-pi-4"), env=NO_ENV, include_others=True)
    listed = [c.name for c in (*the_plan.candidates, *the_plan.others)]
    assert set(delegate_names()) <= set(listed)
    assert all(not c.in_plan for c in the_plan.others) and all(c.in_plan for c in the_plan.candidates)
    data = the_plan.to_dict()
    assert {"profile", "delegates", "selected"} <= set(data)
    assert all(set(d) >= {"name", "available", "reason"} for d in data["delegates"])
    json.dumps(data)


# ---------------------------------------------------------------------------- real runs

def test_xnnpack_through_selection_on_this_machine(labels, tmp_path):
    with load(TFLITE, root=fake_root(tmp_path, "generic-x86-64"), env=NO_ENV) as engine:
        assert engine.delegate == "xnnpack" and engine.fallback_reason is None
        assert engine.selection.profile == "generic-x86-64" and engine.selection.chosen.name == "xnnpack"
        assert_reference_top1(engine, labels)


def test_onnxruntime_through_selection_on_a_jetson_root(labels, tmp_path):
    """Orin plans tensorrt first; here it is unavailable, so ONNX Runtime runs and says why."""
    from edgeinfer.device.cores import usable_cores

    root = fake_root(tmp_path, "jetson-orin-nano")
    with load(ONNX, root=root, env=NO_ENV) as engine:
        assert engine.delegate == "onnxruntime"
        assert engine.threads == usable_cores(root).usable  # the profile leaves it to the thread plan
        assert "tensorrt:fp16" in engine.fallback_reason and "onnxruntime-gpu" in engine.fallback_reason
        assert_reference_top1(engine, labels)


def test_openvino_cpu_through_selection(labels, tmp_path):
    with load(ONNX, root=fake_root(tmp_path, "x86-64-ncs2"), env=NO_ENV) as engine:
        assert engine.description == "openvino:CPU"
        assert "MYRIAD" in engine.fallback_reason
        assert_reference_top1(engine, labels)
    with load(TFLITE, "openvino:CPU") as engine:
        assert engine.description == "openvino:CPU" and engine.fallback_reason is None
        assert_reference_top1(engine, labels, {"parrot.jpg": REFERENCE_TOP1["parrot.jpg"]})


def test_edgetpu_model_falls_back_to_its_cpu_twin(labels):
    """No TPU here: the _edgetpu model runs as its CPU twin on LiteRT, and the engine says so."""
    with edgeinfer.load(EDGETPU, "coral") as engine:
        assert engine.delegate == "xnnpack" and Path(engine.model.path) == TWIN
        assert "coral: libedgetpu.so.1 not found" in engine.fallback_reason
        assert "running the CPU twin mobilenet_v1_0.25_128_quant.tflite on xnnpack" in engine.fallback_reason
        assert engine.selection.candidates[0].name == "coral" and engine.selection.chosen.model == str(TWIN)
        classifier = ImageClassifier(engine, labels, top_k=1)
        twin_scores = {}
        for image in ("parrot.jpg", "squat.bmp"):  # the small twin agrees with the reference on these
            top = classifier.classify_file(IMAGES / image)
            assert top[0].label.startswith(REFERENCE_TOP1[image][0]), (image, top)
            twin_scores[image] = class_scores(engine.output_view(0), engine.outputs[0]).copy()
    with edgeinfer.load(TWIN, "xnnpack") as direct:  # the same numbers as loading the twin directly
        classifier = ImageClassifier(direct, labels)
        for image, scores in twin_scores.items():
            classifier.classify_file(IMAGES / image)
            np.testing.assert_array_equal(class_scores(direct.output_view(0), direct.outputs[0]), scores)


def test_edgetpu_twin_when_the_profile_has_coral_but_real_loading_fails(tmp_path, labels):
    """The fake root says libedgetpu is there; the real ctypes load says it is not."""
    with load(EDGETPU, root=pi4_coral(tmp_path, libedgetpu=True), env=NO_ENV) as engine:
        coral = engine.selection.candidates[0]
        assert coral.name == "coral" and not coral.available and coral.reason.startswith("failed to load: ")
        assert "libedgetpu.so.1" in coral.reason
        assert engine.delegate == "xnnpack" and Path(engine.model.path) == TWIN
        assert engine.fallback_reason.startswith("coral:usb: failed to load: ")
        top = ImageClassifier(engine, labels, top_k=1).classify_file(IMAGES / "parrot.jpg")
        assert top[0].label == "macaw"


def test_edgetpu_model_without_a_twin_says_what_is_missing(tmp_path):
    lonely = tmp_path / "lonely_edgetpu.tflite"
    shutil.copy(EDGETPU, lonely)
    with pytest.raises(DelegateUnavailable, match=r"no CPU twin lonely\.tflite"):
        edgeinfer.load(lonely, "coral")


# ----------------------------------------------------------------------------------- strict

def test_strict_mode_turns_a_fallback_into_an_error(tmp_path):
    with pytest.raises(DelegateUnavailable, match="coral") as info:
        edgeinfer.load(EDGETPU, "coral", strict=True)
    assert "libedgetpu" in info.value.reason
    with pytest.raises(DelegateUnavailable, match=r"MYRIAD.*strict mode: no fallback to openvino:CPU"):
        load(ONNX, root=fake_root(tmp_path / "a", "x86-64-ncs2"), strict=True, env=NO_ENV)
    with pytest.raises(DelegateUnavailable, match="strict mode"):
        load(ONNX, root=fake_root(tmp_path / "b", "x86-64-ncs2"), env={STRICT_ENV: "1"})


def test_strict_mode_allows_the_intended_delegate_and_format_filtering(tmp_path):
    with load(TFLITE, root=pi4_coral(tmp_path, libedgetpu=True), strict=True, env=NO_ENV) as engine:
        assert engine.delegate == "xnnpack" and engine.fallback_reason is None


# ------------------------------------------------------------------------------- precedence

def test_explicit_then_environment_then_profile(tmp_path):
    root = fake_root(tmp_path, "raspberry-pi-4")
    with load(ONNX, root=root, env=NO_ENV) as engine:
        assert engine.delegate == "onnxruntime" and engine.selection.source == "profile raspberry-pi-4"
    with load(ONNX, root=root, env={DELEGATE_ENV: "openvino:CPU"}) as engine:
        assert engine.description == "openvino:CPU" and engine.selection.source == f"${DELEGATE_ENV}"
    with load(ONNX, "onnxruntime", root=root, env={DELEGATE_ENV: "openvino:CPU"}) as engine:
        assert engine.delegate == "onnxruntime" and engine.selection.source == "explicit"


def test_environment_delegate_is_read_by_edgeinfer_load(monkeypatch):
    monkeypatch.setenv(DELEGATE_ENV, "openvino")
    with edgeinfer.load(TFLITE) as engine:
        assert engine.delegate == "openvino"
    monkeypatch.setenv(DELEGATE_ENV, "nonesuch")
    with pytest.raises(ValueError, match=rf"\${DELEGATE_ENV}='nonesuch': unknown delegate"):
        edgeinfer.load(TFLITE)


def test_unknown_delegate_in_a_profile_is_a_candidate_with_a_reason(tmp_path):
    profiles = tmp_path / "profiles"
    write_profile(profiles, "lab.yaml", "name: lab\nmatch: {arch: [x86_64]}\ndelegates: [hailo, xnnpack]\n")
    root = FakeRoot(tmp_path / "root").cpu("x86_64").file("/etc/lab", "")
    with load(TFLITE, root=root, profile="lab", profile_dirs=[profiles], env=NO_ENV) as engine:
        assert engine.delegate == "xnnpack"
        assert "no delegate named 'hailo' is installed" in engine.fallback_reason


def test_unknown_profile_name_is_a_profile_error():
    with pytest.raises(ProfileError, match="no device profile named 'pi9'"):
        plan(TFLITE, profile="pi9", env=NO_ENV)


def test_nothing_can_run_lists_every_candidate(tmp_path):
    with pytest.raises(NoDelegateAvailable) as info:
        load(EDGETPU, root=fake_root(tmp_path, "raspberry-pi-4"), env=NO_ENV)
    assert set(info.value.reasons) == {"xnnpack", "onnxruntime", "openvino:CPU"}
    assert "mobilenet_v1_0.25_128_quant.tflite" in info.value.reasons["xnnpack"]


# ------------------------------------------------------------------- delegates without hardware

def test_new_delegates_are_registered():
    assert {"coral", "tensorrt", "onnxruntime-gpu"} <= set(BUILTIN_DELEGATES)


def test_gpu_delegates_say_precisely_why_they_cannot_run_here():
    trt = get_delegate("tensorrt").unavailable_reason("fp16")
    assert "python module 'tensorrt' is not installed" in trt and "python3-libnvinfer" in trt
    assert "CUDA" in trt  # and the CUDA side: no libcudart, or no GPU behind it
    ort = get_delegate("onnxruntime-gpu").unavailable_reason()
    assert "CUDAExecutionProvider" in ort and "CPUExecutionProvider" in ort and "onnxruntime-gpu" in ort
    assert "not one of fp32" in get_delegate("tensorrt").unavailable_reason("fp8")
    with pytest.raises(DelegateUnavailable, match="tensorrt"):
        edgeinfer.load(ONNX, "tensorrt")
    with pytest.raises(DelegateUnavailable, match="onnxruntime-gpu"):
        edgeinfer.load(ONNX, "onnxruntime-gpu:cuda")


def test_openvino_device_choice_reasons():
    ov = get_delegate("openvino")
    assert ov.unavailable_reason("CPU") is None and ov.unavailable_reason("AUTO") is None
    assert "no MYRIAD plugin" in ov.unavailable_reason("MYRIAD")
    assert "unknown OpenVINO device 'TPU'" in ov.unavailable_reason("TPU")
    with pytest.raises(DelegateUnavailable, match=r"2022\.3"):
        edgeinfer.load(ONNX, "openvino:MYRIAD")
    with edgeinfer.load(TFLITE, "openvino:AUTO") as engine:
        assert engine.description == "openvino:AUTO"
        engine.invoke()


def test_tensorrt_options_and_cache_key(tmp_path):
    assert TensorRTOptions.from_device("int8,dla:1", env={}) == TensorRTOptions(precision="int8", dla_core=1)
    assert TensorRTOptions.from_device(None, env={}).precision == "fp16"
    fp16 = cache_key("ab" * 32, "10.3.0", "Orin", "8.7", TensorRTOptions())
    again = cache_key("ab" * 32, "10.3.0", "Orin", "8.7", TensorRTOptions(gpu=0))
    assert cache_path(tmp_path, fp16) == cache_path(tmp_path, again)  # a restart finds the same file
    variants = [cache_key("cd" * 32, "10.3.0", "Orin", "8.7", TensorRTOptions()),
                cache_key("ab" * 32, "8.6.2", "Orin", "8.7", TensorRTOptions()),
                cache_key("ab" * 32, "10.3.0", "NVIDIA H100", "9.0", TensorRTOptions()),
                cache_key("ab" * 32, "10.3.0", "Orin", "8.7", TensorRTOptions(precision="fp32"))]
    paths = {cache_path(tmp_path, k) for k in variants} | {cache_path(tmp_path, fp16)}
    assert len(paths) == 5 and all(p.parent == tmp_path / "tensorrt" for p in paths)


# ----------------------------------------------------------------------- libedgetpu boundary

FAKE_LIBEDGETPU = r"""
#include <stddef.h>
typedef void (*report_fn)(const char *);
void *tflite_plugin_create_delegate(char **keys, char **values, int n, report_fn report) {
    (void)keys; (void)values; (void)n;
    if (report) report("fake libedgetpu: no Edge TPU is connected");
    return NULL;
}
void tflite_plugin_destroy_delegate(void *delegate) { (void)delegate; }
"""


def _run_with_library_dir(directory: Path, code: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(directory),
           "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the stand-in libedgetpu")
def test_libedgetpu_without_a_tpu_is_mapped_and_prints_nothing(tmp_path):
    """A stand-in libedgetpu that, like the real one with no TPU attached, returns no delegate."""
    (tmp_path / "fake.c").write_text(FAKE_LIBEDGETPU)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libedgetpu.so.1"), str(tmp_path / "fake.c")],
                   check=True)
    result = _run_with_library_dir(tmp_path, f"""
        import gc
        from edgeinfer.runtime.delegates.coral import CoralDelegate, library_problem
        from edgeinfer.errors import DelegateUnavailable
        from edgeinfer.runtime.model import inspect_model
        print("library:", library_problem())
        try:
            CoralDelegate()._load_on_tpu(inspect_model({str(EDGETPU)!r}), threads=None, device="usb:0")
        except DelegateUnavailable as exc:
            print("reason:", exc.reason)
        gc.collect()
    """)
    assert result.returncode == 0, result.stderr
    assert "library: None" in result.stdout
    assert "reason: libedgetpu could not open the Edge TPU usb:0" in result.stdout
    assert "fake libedgetpu: no Edge TPU is connected" in result.stdout
    assert result.stderr == ""  # no "Exception ignored in Delegate.__del__" traceback


def test_a_broken_libedgetpu_is_caught_before_load_delegate(tmp_path):
    (tmp_path / "libedgetpu.so.1").write_bytes(b"not an ELF file")
    result = _run_with_library_dir(tmp_path, """
        from edgeinfer.runtime.delegates.coral import library_problem
        print(library_problem())
    """)
    assert result.returncode == 0 and result.stderr == ""
    assert "libedgetpu.so.1" in result.stdout and "does not load" in result.stdout


# -------------------------------------------------------------------- third-party delegates

THIRD_PARTY = '''
from edgeinfer import Delegate
from edgeinfer.runtime.delegates.xnnpack import XnnpackDelegate


class LabCpuDelegate(Delegate):
    """A third-party delegate written before `host` existed: no host parameter."""

    name = "labcpu"
    formats = XnnpackDelegate.formats

    def unavailable_reason(self, device=None):
        return None

    def load(self, model, *, threads=None, device=None):
        engine = XnnpackDelegate().load(model, threads=threads, device=device)
        engine.delegate = self.name
        return engine
'''


def test_third_party_delegate_registers_through_the_entry_point_group(tmp_path):
    site = tmp_path / "site"
    (site / "labdelegate-1.0.dist-info").mkdir(parents=True)
    (site / "labdelegate.py").write_text(THIRD_PARTY)
    (site / "labdelegate-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: labdelegate\n"
                                                                 "Version: 1.0\n")
    (site / "labdelegate-1.0.dist-info" / "entry_points.txt").write_text(
        "[edgeinfer.delegates]\nlabcpu = labdelegate:LabCpuDelegate\n")
    profiles = tmp_path / "profiles"
    write_profile(profiles, "lab.yaml", "name: lab\nmatch: {arch: [x86_64]}\ndelegates: [labcpu, xnnpack]\n")
    root = FakeRoot(tmp_path / "root").cpu("x86_64")
    code = f"""
        import json, edgeinfer
        from edgeinfer.runtime.delegates.registry import delegate_names
        from edgeinfer.pipeline.classify import ImageClassifier
        from edgeinfer.pipeline.labels import Labels
        engine = edgeinfer.load({str(TFLITE)!r}, root={str(root)!r}, profile_dirs=[{str(profiles)!r}])
        top = ImageClassifier(engine, Labels.load({str(LABELS / "imagenet_labels.txt")!r})).classify_file(
            {str(IMAGES / "parrot.jpg")!r})
        print(json.dumps({{"names": delegate_names(), "delegate": engine.delegate,
                          "profile": engine.selection.profile, "top1": top[0].label,
                          "is_delegate": isinstance(edgeinfer.get_delegate("labcpu"), edgeinfer.Delegate)}}))
    """
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{site}"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "labcpu" in data["names"] and data["names"][: len(BUILTIN_DELEGATES)] == list(BUILTIN_DELEGATES)
    assert data == {**data, "delegate": "labcpu", "profile": "lab", "top1": "macaw", "is_delegate": True}
