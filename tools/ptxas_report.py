#!/usr/bin/env python3
"""ptxas's register and spill report for one kernel variant, without a GPU: compiles
`src/gpu/kernel/attention.hip` (its headers inlined, as `src/gpu/source.rs` does) with NVRTC for
sm_90a and `-Xptxas -v`, and with `--sass FILE` also writes the SASS (nvdisasm of NVRTC's
cubin: PyPI's cuobjdump 13.2 failed on NVRTC 13.0's cubins, nvdisasm 13.5 reads them), where
spills (`LDL`/`STL`) can be told apart by warpgroup: the copying one's code follows
the computing ones' last `EXIT` before its `USETMAXREG.DEALLOC`.

    # libnvrtc (CI's nvidia-cuda-nvrtc wheel) and, for --sass, PyPI's nvidia-cuda-nvdisasm
    LD_LIBRARY_PATH=$NVRTC_LIB python3 tools/ptxas_report.py --sass /tmp/k.sass \\
        -DVA_HEAD_DIM_PAD=80 -DVA_HEAD_DIM_V_PAD=72 -DVA_BLOCK_N=128 -DVA_WARPS=8 \\
        -DVA_ROWS_PER_WARP=16 -DVA_Q_IN_REGISTERS=0 -DVA_MIN_BLOCKS=1 -DVA_STAGES=3 \\
        -DVA_Q_BUFFERS=2 -DVA_SOFTCAP=0 -DVA_WGMMA=1

The -D list is `Variant::defines` (src/gpu/plan.rs). Prints ptxas's lines per kernel; with
--sass, the spill instructions of the computing and the copying warps of va_attention_forward.
"""
import argparse
import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "gpu", "kernel")


def source():
    """attention.hip with its local headers inlined wherever included, as `src/gpu/source.rs`
    does (a header may sit in both branches of an `#if`: fragments.h for the wgmma and the
    mma.sync tiles)."""

    def inline(name):
        lines = []
        for line in open(os.path.join(KERNEL, name)).read().splitlines():
            header = re.match(r'#include "(.*)"', line)
            if header and os.path.exists(os.path.join(KERNEL, header.group(1))):
                lines.append(inline(header.group(1)))
            else:
                lines.append(line)
        return "\n".join(lines)

    return inline("attention.hip")


def nvrtc():
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if name.startswith("libnvrtc.so"):
                return ctypes.CDLL(os.path.join(directory, name))
    found = ctypes.util.find_library("nvrtc")
    if not found:
        sys.exit("libnvrtc not found: put the nvidia-cuda-nvrtc wheel's lib folder on LD_LIBRARY_PATH")
    return ctypes.CDLL(found)


def forward_function(sass):
    """The attention kernel's code in nvdisasm's listing of the cubin."""
    return sass.split(".text.va_attention_forward:", 1)[-1].split(".section", 1)[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sass", help="write the SASS here (needs nvdisasm on the PATH)")
    args, defines = parser.parse_known_args()
    lib = nvrtc()
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source().encode(), b"attention.hip", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    options = [b"--gpu-architecture=sm_90a", b"--std=c++17", b"--ptxas-options=-v"] + [d.encode() for d in defines]
    status = lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    for line in log.value.decode().splitlines():
        if "error" in line or "Compiling entry" in line or "registers" in line or "spill" in line:
            print(line)
    if status:
        sys.exit(f"NVRTC failed ({status})")
    if args.sass:
        nvdisasm = shutil.which("nvdisasm")
        if not nvdisasm:
            sys.exit("nvdisasm not found (PyPI: nvidia-cuda-nvdisasm, its bin folder on the PATH)")
        lib.nvrtcGetCUBINSize(program, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(program, cubin)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin.raw)
            f.flush()
            sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
        open(args.sass, "w").write(sass)
        forward = forward_function(sass)
        # The copying warps branch off to their USETMAXREG.DEALLOC after the computing warps'
        # last EXIT: what lies between (their prologue) is theirs too.
        before, _, copying = forward.partition("USETMAXREG.DEALLOC")
        computing, exit_, prologue = before.rpartition("EXIT")
        if not exit_:
            computing, prologue = before, ""
        copying = prologue + copying
        count = lambda code: len(re.findall(r"\b(LDL|STL)\b", code))
        print(f"va_attention_forward spill instructions: computing warps {count(computing)}, copying warps {count(copying)}")


if __name__ == "__main__":
    main()
