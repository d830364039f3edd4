"""Which CPUs saturate uint8 x int8 products (ONNX Runtime's and OpenVINO's fast INT8 kernels), from cpuinfo."""

from __future__ import annotations

import pytest

from edgeinfer.device.host import cpu_flags, u8s8_saturates


@pytest.mark.parametrize(("arch", "flags", "saturates"), [
    ("x86_64", "fpu sse4_1 avx fma f16c avx2", True),  # an AVX2 EPYC (Zen 3), a Skylake desktop
    ("x86_64", "sse4_1 avx2 avx512f avx512bw avx512vl", True),  # Skylake-SP: AVX-512 but no VNNI
    ("amd64", "sse4_1 sse4_2", True),  # an SSE4.1-only Atom (PMADDUBSW), Windows' spelling of the arch
    ("x86_64", "avx2 avx512f avx512_vnni", False),  # Cascade/Ice Lake, Zen 4: VPDPBUSD sums in 32 bits
    ("x86_64", "avx2 avx_vnni", False),  # Alder Lake, N100
    ("x86_64", "avx2 avx512_vnni amx_int8 amx_tile", False),  # Sapphire Rapids
    ("aarch64", "fp asimd asimddp i8mm", False),  # ARM kernels widen before they add
    ("armv7l", "half thumb neon vfpv4", False),
])
def test_int8_products_saturate_on_x86_without_vnni(arch, flags, saturates):
    assert u8s8_saturates(arch, flags.split()) is saturates


def test_cpu_flags_are_read_from_the_roots_cpuinfo(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_1 avx2\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_1 avx2\n")
    assert cpu_flags(tmp_path) == {"fpu", "sse4_1", "avx2"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
