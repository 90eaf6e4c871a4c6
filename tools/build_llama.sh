#!/usr/bin/env bash
# Build llama.cpp's command-line tools for the peer benchmark (`smallem_bench --peers`, 11_interop): llama-completion
# (plain decoding), llama-speculative (a draft model), llama-lookup (prompt lookup) and llama-bench.
# Source: the llama.cpp that PyPI's llama-cpp-python 0.3.36 source distribution vendors (PyPI is reachable where GitHub
# is not). Output: $SMALLEM_HOME/llama.cpp/0.3.36/bin (default ~/.cache/smallem_spec/...), which the benchmark finds.
# Compiled for this CPU (-DGGML_NATIVE=ON), no GPU backend, linked statically to llama.cpp (the binaries can be moved).
# Measured 2026-11-30 on the Intel Xeon kind, 2 cores: about 8 minutes on an otherwise idle machine; nothing to do when the
# tools are already there.
set -euo pipefail
VER=0.3.36
HOME_DIR=${SMALLEM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/smallem_spec}
DEST=$HOME_DIR/llama.cpp/$VER
TOOLS="llama-completion llama-speculative llama-lookup llama-bench"
have=1; for t in $TOOLS; do [ -x "$DEST/bin/$t" ] || have=0; done
if [ $have = 1 ]; then echo "build_llama: the tools are in $DEST/bin"; exit 0; fi
command -v cmake >/dev/null || { echo "build_llama: cmake is missing (Debian: apt-get install cmake)" >&2; exit 2; }
command -v g++ >/dev/null || { echo "build_llama: g++ is missing (Debian: apt-get install g++)" >&2; exit 2; }
PY=${PYTHON:-python3}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
echo "build_llama: fetching llama-cpp-python $VER's source from PyPI"
$PY -m pip download -q --no-deps --no-binary :all: --no-cache-dir -d "$WORK" "llama-cpp-python==$VER"
tar -xzf "$WORK"/llama_cpp_python-$VER.tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VER/vendor/llama.cpp"
echo "build_llama: compiling $TOOLS (minutes)"
cmake -S "$SRC" -B "$WORK/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF > "$WORK/cmake.log" 2>&1 \
  || { tail -20 "$WORK/cmake.log" >&2; echo "build_llama: cmake configuration failed" >&2; exit 1; }
cmake --build "$WORK/build" -j"$(nproc)" --target $TOOLS > "$WORK/build.log" 2>&1 \
  || { tail -20 "$WORK/build.log" >&2; echo "build_llama: the build failed" >&2; exit 1; }
mkdir -p "$DEST/bin"
for t in $TOOLS; do cp "$WORK/build/bin/$t" "$DEST/bin/"; done
echo "build_llama: the tools are in $DEST/bin"
