// The per-element mixing functions of the view digest, inline so the apply
// and diff hot loops update digests without calls. Spec: docs/format/patch.md,
// "Digest". One source with the GPU kernels: base/digest_terms.h.
#pragma once

#include <cstdint>

#include "format/digest_terms.h"
#include "tern/digest.h"

namespace tern::patch {

using hd::AddElementChange;
using hd::Lane;
using hd::LaneAdd;
using hd::LaneMul;
using hd::Mix64;

}  // namespace tern::patch
