// Plain enums the backends' ops take (backend.h), kept apart so that the
// CUDA kernel headers (C++17) can name them without backend.h.
#pragma once

namespace topkv {

// RoPE pairing (see RopeParams in backend.h):
//   Interleaved (llama.cpp LLAMA_ROPE_TYPE_NORM): pairs (2i, 2i+1). GGUF llama
//     files store q/k permuted for this pairing (convert_hf_to_gguf permute).
//   NeoX (gemma3, qwen2): pairs (i, i + n_rot/2), as Hugging Face rotate_half.
enum class RopeStyle { Interleaved, NeoX };

enum class GluKind { SiLU, GeluTanh };  // out = act(gate) * up

}  // namespace topkv
