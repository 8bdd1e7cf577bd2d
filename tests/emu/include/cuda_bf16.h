/* The emulator's stand-in for CUDA's cuda_bf16.h (tests/emu/cuda_emu.h). */
#include "../cuda_emu.h"
