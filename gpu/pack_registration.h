// A context pack's file mapping registered with the CUDA device
// (cudaHostRegister, read-only), so that kernels read its store rows in place
// over PCIe exactly as they read the runtime's own pinned chunks: `generate
// --pack` then neither copies the store nor holds it twice (issue 6: "the KV
// store ... used in place, not copied").
//
// One registration per mapping and process, shared by every runtime that
// restores from it (--prompts restores once per question); it is undone when
// the last store chunk using it lets go, and it keeps the mapping alive until
// then. CUDA builds only.
#pragma once
#include <memory>
#include <string>

namespace topkv {

class PackReader;

// The registration, or null with `why` set when the device cannot read
// registered host memory at its host address, or the driver refuses (the
// caller then copies the rows into pinned memory, as before).
std::shared_ptr<const void> register_pack_mapping(const PackReader& r, std::string& why);

}  // namespace topkv
