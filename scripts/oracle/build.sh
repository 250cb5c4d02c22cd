# Sourced by the scripts that run llama.cpp through a small C program of this
# directory: `oracle_build NAME OUT` compiles scripts/oracle/NAME.c against the static
# libraries of the llama.cpp build in $LLAMA_BUILD (source tree $LLAMA_CPP) into OUT.
oracle_build() {
  : "${LLAMA_CPP:?set LLAMA_CPP to the llama.cpp source tree}"
  : "${LLAMA_BUILD:?set LLAMA_BUILD to its CMake build directory}"
  gcc -O2 "scripts/oracle/$1.c" -I"$LLAMA_CPP/include" -I"$LLAMA_CPP/ggml/include" \
    -o "$2" "$LLAMA_BUILD/src/libllama.a" "$LLAMA_BUILD/ggml/src/libggml.a" \
    "$LLAMA_BUILD/ggml/src/libggml-cpu.a" "$LLAMA_BUILD/ggml/src/libggml-base.a" \
    -lstdc++ -lm -fopenmp -lpthread
}
