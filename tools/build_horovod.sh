#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release, 2023) from PyPI's sdist against the installed torch,
# cache the wheel keyed by torch and Python version, and install it. Usage: build_horovod.sh PYTHON
#
# On a node with an NVIDIA GPU it builds Horovod's NCCL operations against the NCCL that torch's
# wheels bring (or HOROVOD_NCCL_HOME/_INCLUDE/_LIB), so the cached wheel gets a "-nccl" key.
# Without an MPI compiler it builds the gloo controller alone (launch with horovodrun --gloo).
# HOROVOD_SDIST=path/to/horovod-0.28.1.tar.gz builds offline, for compute nodes without network.
#
# Horovod records the torch it was built for and refuses to load under another one, hence the key.
# Patches, each for a way the unpatched 0.28.1 build fails with current toolchains:
#   * torch >= 2.13 headers need C++20; Horovod's torch extension asks for C++14. The rest of
#     Horovod and its gloo then need C++17, else gloo's static constexpr Store::kDefaultTimeout
#     is defined twice (strong in C++14 objects, inline in C++20 ones) and the link fails.
#   * A CUDA build of torch on a machine with nvcc but no GPU makes FindPytorch pick the CUDA
#     extension and fail looking for cudart; HOROVOD_TORCH_CPU_ONLY=1 forces the CPU extension.
#   * cmake >= 4 rejects third_party/gloo's old minimum; CMAKE_POLICY_VERSION_MINIMUM fixes it.
#   * CUDA 13's nvcc has no C++11 dialect; Horovod compiles its CUDA kernels as C++11 -> C++17.
#   * torch's NCCL wheel ships libnccl.so.2 only, and Horovod's FindNCCL looks for libnccl.so.
#   * GCC 13's libstdc++ no longer brings <string> and <cstdint> in through <mutex> and friends,
#     which Horovod's headers (group_table.h) rely on: every C++ file force-includes them.
set -euo pipefail
PY="${1:?usage: build_horovod.sh PYTHON}"
VERSION=0.28.1
say() { printf '[horovod] %s\n' "$*"; }

key=$("$PY" -c 'import sys, torch; print(f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")')
gpu_present=0
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu_present=1
if [ "$gpu_present" = 1 ] && [ -z "${HOROVOD_GPU_OPERATIONS+set}" ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
fi
[ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && key="$key-nccl"
cache="${HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness}/horovod-$VERSION/$key"
wheel=$(find "$cache" -maxdepth 1 -name 'horovod-*.whl' -print -quit 2>/dev/null || true)

if [ -z "$wheel" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  say "building Horovod $VERSION for $key (about 2-5 minutes)"
  if [ -n "${HOROVOD_SDIST:-}" ]; then
    cp "$HOROVOD_SDIST" "$work/horovod-$VERSION.tar.gz"
  else
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$VERSION"
  fi
  tar -xzf "$work"/horovod-$VERSION.tar.gz -C "$work"
  src="$work/horovod-$VERSION"
  "$PY" - "$src" <<'EOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1])
torch_cmake = src / "horovod/torch/CMakeLists.txt"
text = torch_cmake.read_text()
assert "set(CMAKE_CXX_STANDARD 14)" in text, "unexpected horovod/torch/CMakeLists.txt"
torch_cmake.write_text(text.replace("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 20)"))
root_cmake = src / "CMakeLists.txt"
text = root_cmake.read_text()
assert "set(CMAKE_CXX_STANDARD 14)" in text, "unexpected CMakeLists.txt"
root_cmake.write_text(text.replace("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)", 1))
find_torch = src / "cmake/Modules/FindPytorch.cmake"
text = find_torch.read_text()
old = "print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)"
assert old in text, "unexpected FindPytorch.cmake"
new = ("import os; print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None) "
       "and os.environ.get('HOROVOD_TORCH_CPU_ONLY') != '1') else False)")
find_torch.write_text(text.replace(old, new))
cuda_cmake = src / "horovod/common/ops/cuda/CMakeLists.txt"
text = cuda_cmake.read_text()
assert "set(CMAKE_CUDA_STANDARD 11)" in text, "unexpected horovod/common/ops/cuda/CMakeLists.txt"
cuda_cmake.write_text(text.replace("set(CMAKE_CUDA_STANDARD 11)", "set(CMAKE_CUDA_STANDARD 17)"))
EOF
  if [ "$gpu_present" = 0 ] && [ -z "${HOROVOD_GPU_OPERATIONS:-}" ]; then
    export HOROVOD_TORCH_CPU_ONLY=1
  fi
  if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-}" ]; then
    nccl=$("$PY" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(s.submodule_search_locations[0] if s else "")')
    if [ -z "$nccl" ] || [ ! -e "$nccl/lib/libnccl.so.2" ]; then
      say "no NCCL found: set HOROVOD_NCCL_HOME to your NCCL, or HOROVOD_GPU_OPERATIONS= for host-staged collectives"
      exit 2
    fi
    mkdir -p "$work/nccl-lib"
    ln -s "$nccl/lib/libnccl.so.2" "$work/nccl-lib/libnccl.so"
    export HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$work/nccl-lib" HOROVOD_NCCL_LINK=SHARED
  fi
  export CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string"
  mpi=(HOROVOD_WITH_MPI=1)
  if ! command -v mpicc >/dev/null; then
    say "no MPI compiler (mpicc): building the gloo controller alone"
    mpi=(HOROVOD_WITHOUT_MPI=1)
  fi
  "$PY" -m pip install -q packaging wheel cffi cloudpickle psutil pyyaml
  mkdir -p "$cache"
  # The compiler's and setuptools' output goes to a log, shown only when the build fails.
  log="$cache/build.log"
  if ! env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 "${mpi[@]}" \
       HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
       "$PY" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    say "the Horovod build failed; its full output is in $log"
    exit 1
  fi
  # Publish the wheel into the cache atomically so an interrupted build never looks finished.
  built=$(find "$work/dist" -maxdepth 1 -name 'horovod-*.whl' -print -quit)
  cp "$built" "$cache/.partial.whl"
  mv "$cache/.partial.whl" "$cache/$(basename "$built")"
  wheel="$cache/$(basename "$built")"
else
  say "using cached wheel $wheel"
fi
"$PY" -m pip install -q --force-reinstall --no-deps "$wheel"
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging cffi
