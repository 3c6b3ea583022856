// A serve view that owns its descriptors and bytes: built tensor by tensor
// (zero-filled) or copied from another view, for tests and benchmarks that
// need a private, mutable copy of a view. Copies are deep.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "tern/view.h"

namespace tern::testing {

struct OwnedView {
  std::deque<TensorDesc> descs;  // deque: stable addresses for the refs
  std::deque<std::vector<uint8_t>> data;

  OwnedView() = default;
  // A copy of `v`'s tensors (descriptors and bytes), in its order.
  explicit OwnedView(const ServeView& v) {
    for (const auto& t : v.tensors) {
      descs.push_back(*t.desc);
      data.emplace_back(t.data, t.data + t.desc->bytes());
    }
  }

  void Add(std::string name, DType dtype, std::vector<uint64_t> shape) {
    descs.push_back(TensorDesc{std::move(name), dtype, std::move(shape)});
    data.emplace_back(descs.back().bytes(), 0);
  }
  MutableServeView Mutable() {
    MutableServeView v;
    for (size_t i = 0; i < descs.size(); ++i) v.tensors.push_back({&descs[i], data[i].data()});
    SortAndCheck(v).IgnoreError();
    return v;
  }
  ServeView View() const {
    ServeView v;
    for (size_t i = 0; i < descs.size(); ++i) v.tensors.push_back({&descs[i], data[i].data()});
    SortAndCheck(v).IgnoreError();
    return v;
  }
};

}  // namespace tern::testing
