"""Compile oxalign's CUDA kernels with NVRTC, exactly as the `cuda` feature does at run time
(common.cuh prepended, default options), and optionally assemble the PTX with ptxas.
Needs libnvrtc (e.g. `pip install nvidia-cuda-nvrtc-cu12`) but no GPU and no nvcc.

usage: python3 check_nvrtc.py LIBNVRTC_SO [--ptxas PTXAS] [--arch sm_90]
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

MODULES = ["token_logprobs", "entropy", "rms_norm", "rope"]
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "cuda")


def compile_ptx(lib, name, source):
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != 0:
        raise RuntimeError(f"nvrtcCreateProgram({name}) failed: {rc}")
    rc = lib.nvrtcCompileProgram(prog, 0, None)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise RuntimeError(f"NVRTC failed on {name}:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode(), log.value.decode().strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("libnvrtc")
    ap.add_argument("--ptxas")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.libnvrtc)
    common = open(os.path.join(SRC, "common.cuh")).read()
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODULES:
            source = common + "\n" + open(os.path.join(SRC, name + ".cu")).read()
            ptx, log = compile_ptx(lib, name, source)
            print(f"{name}: NVRTC ok, {len(ptx)} bytes of PTX" + (f", log: {log}" if log else ""))
            if args.ptxas:
                path = os.path.join(tmp, name + ".ptx")
                open(path, "w").write(ptx)
                out = subprocess.run(
                    [args.ptxas, f"-arch={args.arch}", "-v", path, "-o", path + ".cubin"],
                    capture_output=True, text=True)
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    sys.exit(1)
                print(f"{name}: ptxas {args.arch} ok")


if __name__ == "__main__":
    main()
