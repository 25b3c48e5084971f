"""`make cuda-check`'s resource gate (tools/ptxas_resources.py) reads ptxas -v's report into
per-kernel, per-arch records and fails on any spill: fed recorded ptxas output, no nvcc."""

import importlib.util
import json
import os

import pytest

pytestmark = pytest.mark.no_emulated_pass("parses recorded ptxas output; runs no executor")

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "ptxas_resources.py")
_spec = importlib.util.spec_from_file_location("ptxas_resources", _PATH)
ptxas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ptxas)

_HASH = "_ZN6dynemb4cuda45_GLOBAL__N__083e222f_12_hash_cuda_cu_2300beb716hash_keys_kernelEPKlllPlPh"
_SCAN = (
    "_ZN6dynemb4cuda46_GLOBAL__N__11c0ffee_12_group_cuda_cu_1234abcd17block_scan_kernelEPKllPlS3_"
)

# nvcc 13.0 -Xptxas -v, two -gencode archs: no spill (recorded from csrc/cuda/hash_cuda.cu,
# a shared-memory kernel added).
CLEAN = f"""\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{_HASH}' for 'sm_80'
ptxas info    : Function properties for {_HASH}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 0 barriers, 392 bytes cmem[0]
ptxas info    : Compile time = 1.513 ms
ptxas info    : Compiling entry function '{_SCAN}' for 'sm_80'
ptxas info    : Function properties for {_SCAN}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 2048 bytes smem, 384 bytes cmem[0]
ptxas info    : Compile time = 9.020 ms
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{_HASH}' for 'sm_90'
ptxas info    : Function properties for {_HASH}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers
ptxas info    : Compile time = 2.279 ms
ptxas info    : Compiling entry function '{_SCAN}' for 'sm_90'
ptxas info    : Function properties for {_SCAN}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 2048 bytes smem
ptxas info    : Compile time = 7.500 ms
"""

# A kernel under __launch_bounds__(1024, 2) and a __noinline__ device function that
# spills; in the second run the device function is reported before any kernel.
SPILL = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5tightPfi' for 'sm_80'
ptxas info    : Function properties for _Z5tightPfi
    528 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 528 bytes cumulative stack size, 364 bytes cmem[0]
ptxas info    : Compile time = 20.672 ms
ptxas info    : Function properties for _Z6helperPfi
    0 bytes stack frame, 172 bytes spill stores, 204 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperPfi
    0 bytes stack frame, 168 bytes spill stores, 200 bytes spill loads
ptxas info    : Compiling entry function '_Z5tightPfi' for 'sm_90'
ptxas info    : Function properties for _Z5tightPfi
    528 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 528 bytes cumulative stack size
ptxas info    : Compile time = 24.857 ms
"""


def _lines(text):
    return text.splitlines(keepends=True)


def test_clean_report_gives_a_record_per_kernel_and_arch():
    functions = ptxas.parse(_lines(CLEAN), "csrc/cuda/hash_cuda.cu")
    got = [(f.arch, f.entry, f.registers, f.barriers, f.smem, f.spills) for f in functions]
    assert got == [
        ("sm_80", True, 14, 0, 0, False),
        ("sm_80", True, 30, 1, 2048, False),
        ("sm_90", True, 16, 0, 0, False),
        ("sm_90", True, 30, 1, 2048, False),
    ]
    assert [f.mangled for f in functions] == [_HASH, _SCAN, _HASH, _SCAN]
    assert ptxas.spill_errors(functions) == []


def test_device_functions_take_the_arch_of_their_run():
    functions = ptxas.parse(_lines(SPILL), "s.cu")
    got = [(f.mangled, f.arch, f.entry, f.spill_stores, f.spill_loads) for f in functions]
    assert got == [
        ("_Z5tightPfi", "sm_80", True, 0, 0),
        ("_Z6helperPfi", "sm_80", False, 172, 204),
        ("_Z6helperPfi", "sm_90", False, 168, 200),
        ("_Z5tightPfi", "sm_90", True, 8, 8),
    ]
    assert functions[0].stack_frame == 528 and functions[1].registers is None


@pytest.mark.parametrize(
    "name, short",
    [
        (
            "void dynemb::cuda::(anonymous namespace)::cache_exchange_kernel<32u, "
            "__nv_bfloat16>(dynemb::TableRef<__nv_bfloat16>, dynemb::CacheExchange<float>)",
            "cache_exchange_kernel<32u, __nv_bfloat16>",
        ),
        (
            "void dynemb::cuda::(anonymous namespace)::update_kernel<dynemb::Foo<float> >("
            "dynemb::Parts<dynemb::BackwardPart<float> >, long)",
            "update_kernel<Foo<float>>",
        ),
        (
            "dynemb::cuda::(anonymous namespace)::hash_keys_kernel(long const*, long)",
            "hash_keys_kernel",
        ),
        (_HASH, "hash_keys_kernel"),  # no demangler: the mangled name's own identifier
        ("_Z5tightPfi", "tight"),
        ("_ZN2ns4kernILi32EEEvPfi", "kern"),
    ],
)
def test_short_names(name, short):
    assert ptxas.short_name(name) == short


def test_names_are_kept_without_a_demangler():
    functions = ptxas.parse(_lines(CLEAN), "csrc/cuda/hash_cuda.cu")
    ptxas.name_functions(functions, demangler="/nonexistent/c++filt")
    assert functions[0].name == _HASH and functions[0].short == "hash_keys_kernel"


def test_table_puts_the_archs_side_by_side():
    functions = ptxas.parse(_lines(CLEAN), "csrc/cuda/hash_cuda.cu")
    ptxas.name_functions(functions, demangler="/nonexistent/c++filt")
    table = ptxas.table(functions).splitlines()
    assert "registers (sm_80 / sm_90)" in table[0]
    assert table[2] == (
        "| hash_cuda.cu | `block_scan_kernel` | 1 | 30 / 30 | 0 / 0 | 0+0 / 0+0 | 2048 / 2048 |"
    )
    assert table[3].startswith("| hash_cuda.cu | `hash_keys_kernel` | 1 | 14 / 16 |")


def _run(tmp_path, text, name="x.cu"):
    out = tmp_path / "out"
    report = out / "csrc" / "cuda" / f"{name}.ptxas"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    checked = tmp_path / "resources.checked"
    rc = ptxas.main(["--checked", str(checked), str(out), str(report)])
    return rc, out, checked


def test_gate_passes_and_writes_the_reports(tmp_path, capsys):
    rc, out, checked = _run(tmp_path, CLEAN, "hash_cuda.cu")
    assert rc == 0
    summary = checked.read_text()
    assert "2 kernels, each for sm_80 and sm_90: 0 spill bytes" in summary
    assert "at most 30 registers" in summary and "2048 bytes shared memory" in summary
    records = json.loads((out / "resources.json").read_text())["functions"]
    assert len(records) == 4
    assert {r["source"] for r in records} == {"csrc/cuda/hash_cuda.cu"}
    tsv = (out / "resources.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:3] == ["source", "arch", "mangled"] and len(tsv) == 5
    assert "`hash_keys_kernel`" in (out / "resources.md").read_text()
    assert "`hash_keys_kernel`" in capsys.readouterr().out


def test_gate_fails_on_a_spill_naming_function_arch_and_bytes(tmp_path, capsys):
    assert _run(tmp_path, CLEAN, "s.cu")[0] == 0  # an earlier pass, then a spill
    rc, out, checked = _run(tmp_path, SPILL, "s.cu")
    assert rc == 1 and not checked.exists()
    err = capsys.readouterr().err
    assert "helper spills on sm_80: 172 bytes spill stores, 204 bytes spill loads" in err
    assert "helper spills on sm_90: 168 bytes spill stores, 200 bytes spill loads" in err
    assert "tight spills on sm_90: 8 bytes spill stores, 8 bytes spill loads" in err
    assert "tight spills on sm_80" not in err
    assert "3 function(s) spill registers" in err
    # The report is written all the same, spills included.
    records = json.loads((out / "resources.json").read_text())["functions"]
    assert sum(r["spill_stores"] for r in records) == 172 + 168 + 8
    assert "`helper (device)`" in (out / "resources.md").read_text()


def test_gate_fails_on_a_report_without_kernels(tmp_path, capsys):
    rc, _, checked = _run(tmp_path, "nvcc warning : something\n")
    assert rc == 1 and not checked.exists()
    assert "ptxas reported no kernel" in capsys.readouterr().err


def test_properties_without_their_frame_line_are_an_error(tmp_path, capsys):
    broken = CLEAN.replace(
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n", "", 1
    )
    with pytest.raises(ptxas.ReportError, match="no stack and spill line"):
        ptxas.parse(_lines(broken), "x.cu")
    rc, _, _ = _run(tmp_path, broken)
    assert rc == 1 and "no stack and spill line" in capsys.readouterr().err
