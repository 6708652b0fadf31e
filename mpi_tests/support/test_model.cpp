#include "support/test_model.h"

#include <hdf5.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

namespace h5ckpt::testing {

std::string Layout::name() const {
  return "tp" + std::to_string(tp) + "dp" + std::to_string(dp) + "pp" + std::to_string(pp) + (zero ? "z" : "");
}

std::vector<Layout> layouts_for(int world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= world; tp *= 2)
    for (int pp = 1; pp <= 2; ++pp)
      if (world % (tp * pp) == 0)
        for (bool zero : {false, true}) out.push_back(Layout{tp, world / (tp * pp), pp, zero});
  return out;
}

namespace {

uint32_t key_hash(const std::string& key) {
  uint32_t h = 2166136261u;
  for (unsigned char c : key) h = (h ^ c) * 16777619u;
  return h % 1009;
}

uint16_t bf16_bits(float f) {  // values used here are exact in bf16: truncation is exact
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

void expected_value(const std::string& key, DType dtype, int64_t flat, void* out) {
  const int64_t h = key_hash(key);
  switch (dtype) {
    case DType::kF32: {
      float v = static_cast<float>(((flat * 7 + h) % 2039) - 1000) / 8.0f;
      std::memcpy(out, &v, 4);
      break;
    }
    case DType::kBF16: {
      uint16_t b = bf16_bits(static_cast<float>(((flat * 7 + h) % 251) - 125) / 128.0f);
      std::memcpy(out, &b, 2);
      break;
    }
    case DType::kI64: {
      int64_t v = flat * 3 + h;
      std::memcpy(out, &v, 8);
      break;
    }
    default: std::abort();
  }
}

int64_t global_flat_index(const ShardSpec& shard, const Shape& shape, int64_t j) {
  int64_t within = j + (shard.flat ? shard.flat->first : 0);  // index in the box's flattening
  // Innermost dimension first, no allocation: tests call this once per element of every shard.
  int64_t flat = 0, stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    flat += (shard.box.offset[d] + within % shard.box.shape[d]) * stride;
    within /= shard.box.shape[d];
    stride *= shape[d];
  }
  return flat;
}

void TestModel::add(const std::string& key, DType dtype, Shape shape, ShardSpec shard, bool fill) {
  const size_t es = dtype_size(dtype);
  buffers_.emplace_back(static_cast<size_t>(shard.numel()) * es + 1, 0xAB);  // +1: never null
  auto& buf = buffers_.back();
  if (fill)
    for (int64_t j = 0; j < shard.numel(); ++j)
      expected_value(key, dtype, global_flat_index(shard, shape, j), buf.data() + j * es);
  state_.add(key, dtype, std::move(shape), std::move(shard), buf.data());
}

TestModel::TestModel(const Layout& L, RankCoords c, bool fill) {
  buffers_.reserve(64);
  const int layers = 2;
  // Optimizer state of a param shard: same box, or a flat range split over DP (ZeRO).
  auto with_optimizer = [&](const std::string& name, DType dtype, const Shape& shape, const ShardSpec& shard) {
    add("model/" + name, dtype, shape, shard, fill);
    ShardSpec opt = shard;
    if (L.zero) {
      const int64_t n = shard.box.volume();
      opt = ShardSpec::flat_range(shard.box, n * c.dp / L.dp, n * (c.dp + 1) / L.dp);
    }
    add("optimizer/exp_avg/" + name, DType::kF32, shape, opt, fill);
  };
  const Shape vocab{37, 16};  // 37: uneven over every TP size
  if (c.pp == 0) with_optimizer("embedding.weight", DType::kF32, vocab, ShardSpec::split(vocab, 0, L.tp, c.tp));
  for (int l = 0; l < layers; ++l) {
    if (l * L.pp / layers != c.pp) continue;  // layer lives on another stage
    const std::string p = "layers." + std::to_string(l) + ".";
    const Shape qkv{48, 16}, proj{16, 44}, norm{16}, bias{40}, scale{3};
    with_optimizer(p + "qkv.weight", DType::kF32, qkv, ShardSpec::split(qkv, 0, L.tp, c.tp));
    with_optimizer(p + "proj.weight", DType::kF32, proj, ShardSpec::split(proj, 1, L.tp, c.tp));
    with_optimizer(p + "norm.weight", DType::kF32, norm, ShardSpec::whole(norm));
    with_optimizer(p + "scale", DType::kF32, scale, ShardSpec::whole(scale));  // tiny: empty ZeRO ranges
    add("model/" + p + "fc1.bias", DType::kBF16, bias, ShardSpec::split(bias, 0, L.tp, c.tp), fill);
  }
  if (c.pp == L.pp - 1) with_optimizer("output.weight", DType::kF32, vocab, ShardSpec::split(vocab, 0, L.tp, c.tp));
  add("extra/step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1}), fill);
}

int64_t TestModel::count_mismatches(std::string* first) const {
  int64_t bad = 0;
  for (size_t k = 0; k < state_.items().size(); ++k) {
    const StateItem& it = state_.items()[k];
    const size_t es = dtype_size(it.dtype);
    unsigned char want[8];
    for (int64_t j = 0; j < it.shard.numel(); ++j) {
      const int64_t g = global_flat_index(it.shard, it.global_shape, j);
      expected_value(it.key, it.dtype, g, want);
      if (std::memcmp(want, buffers_[k].data() + j * es, es) != 0) {
        if (bad++ == 0 && first)
          *first = it.key + " element " + std::to_string(j) + " (global " + std::to_string(g) + ")";
      }
    }
  }
  return bad;
}

void TestModel::scribble() {
  for (auto& b : buffers_) std::memset(b.data(), 0x5A, b.size());
}

std::vector<unsigned char> read_dataset_bytes(const std::string& file, const std::string& dataset) {
  std::vector<unsigned char> out;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return out;
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  if (d >= 0) {
    hid_t t = H5Dget_type(d);
    out.resize(H5Dget_storage_size(d));
    if (!out.empty()) H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
    H5Tclose(t);
    H5Dclose(d);
  }
  H5Fclose(f);
  return out;
}

bool same_datasets_on_all_ranks(const std::string& a, const std::string& b, bool* here, std::string* why) {
  *here = same_datasets(a, b, why);
  int ok = *here ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

bool same_datasets(const std::string& a, const std::string& b, std::string* why) {
  auto ia = read_checkpoint_info(a), ib = read_checkpoint_info(b);
  if (!ia.ok() || !ib.ok()) {
    *why = "cannot read metadata: " + (ia.ok() ? ib.status() : ia.status()).to_string();
    return false;
  }
  if (ia->tensors.size() != ib->tensors.size()) {
    *why = "different tensor counts";
    return false;
  }
  for (size_t i = 0; i < ia->tensors.size(); ++i) {
    const auto& k = ia->tensors[i].key;
    if (k != ib->tensors[i].key) {
      *why = "key " + k + " vs " + ib->tensors[i].key;
      return false;
    }
    if (read_dataset_bytes(ia->data_file, "/" + k) != read_dataset_bytes(ib->data_file, "/" + k)) {
      *why = "dataset /" + k + " differs";
      return false;
    }
  }
  return true;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

uint64_t sum_all(uint64_t v) {
  uint64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

uint64_t max_all(uint64_t v) {
  uint64_t m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

std::string shared_temp_dir(MPI_Comm comm, const std::string& tag) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  char buf[4096] = {0};
  if (rank == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("h5ckpt-" + tag + "-XXXXXX")).string();
    std::strncpy(buf, tmpl.c_str(), sizeof buf - 1);
    if (!mkdtemp(buf)) buf[0] = 0;
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm);
  return buf;
}

}  // namespace h5ckpt::testing
