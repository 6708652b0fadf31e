// libFuzzer target, structure-aware: lies in the records of a format-v2 index behind correct
// outer checksums, read back through the real readers against a real data file (issue 25).
//
// At start-up the harness builds one checkpoint in memory: tensors with row, column and flat
// (ZeRO) regions, verification blocks over their canonical streams, the v2 tables. The input is a
// list of 15-byte edits {table, record (LE32), byte in record, width (1/2/4/8), value (LE64)}
// applied to the tables, and a 4-byte position of one data byte to flip. The summary is then
// re-signed with every table's xxh3 made right, as a hostile writer would, so what gets fuzzed is
// the record validation and the reads behind it, not the checksums.
//
// The oracle: the data file holds one flipped byte, so a read that succeeds must have delivered
// exactly the bytes the tensor was saved with; anything else is a verification hole (an index
// that switched checks off, a span read empty, a block that covers nothing). Crashes and
// sanitizer reports are findings too.
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "storage/meta_v2.h"
#include "storage/format.h"
#include "storage/region_reader.h"
#include "storage/verify_blocks.h"
#include "util/checked_math.h"

using namespace h5ckpt;
namespace v2 = h5ckpt::storage::v2;

namespace {

struct Reference {
  CheckpointInfo info;
  std::vector<char> data;  // the tensors' bytes, as saved (file offsets from 0)
  v2::Encoded encoded;
  std::array<int64_t, v2::kTableCount> offsets{};
  std::string path;  // scratch data file
};

int64_t linear(const Shape& shape, const Shape& at) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + at[d];
  return i;
}

// The canonical stream of a region: its box row-major, or elements [b, e) of the box's flattening.
std::vector<char> canonical(const TensorInfo& t, const ShardSpec& s, const char* tensor_bytes) {
  const uint64_t es = dtype_size(t.dtype);
  std::vector<char> out;
  const Box& box = s.box;
  const int64_t n = box.volume();
  const int64_t b = s.flat ? s.flat->first : 0, e = s.flat ? s.flat->second : n;
  Shape at(box.ndim());
  for (int64_t k = b; k < e; ++k) {
    int64_t rest = k;
    for (size_t d = box.ndim(); d-- > 0;) {
      at[d] = box.offset[d] + rest % box.shape[d];
      rest /= box.shape[d];
    }
    const char* p = tensor_bytes + linear(t.shape, at) * static_cast<int64_t>(es);
    out.insert(out.end(), p, p + es);
  }
  return out;
}

Reference build() {
  Reference ref;
  CheckpointInfo& info = ref.info;
  info.library_version = "fuzz";
  info.step = 7;
  info.saved_sizes = {2, 2, 1};
  info.saved_coords = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}};
  info.attributes = {{"layout", "tp2.dp2"}};
  auto add = [&](std::string key, DType dtype, Shape shape, std::vector<ShardSpec> shards, uint64_t target) {
    TensorInfo t;
    t.key = std::move(key);
    t.dtype = dtype;
    t.shape = std::move(shape);
    int64_t n = 1;
    for (int64_t e : t.shape) n *= e;
    t.nbytes = static_cast<uint64_t>(n) * dtype_size(dtype);
    t.file_offset = static_cast<int64_t>(ref.data.size());
    for (uint64_t i = 0; i < t.nbytes; ++i)  // distinct bytes per tensor and position
      ref.data.push_back(static_cast<char>((i * 131 + t.key.size() * 17 + i / 251) & 0xff));
    const char* bytes = ref.data.data() + t.file_offset;
    int writer = 0;
    for (const ShardSpec& s : shards) {
      SavedRegion r;
      r.shard = s;
      r.writer_rank = writer++ % 4;
      r.block_bytes = storage::choose_block_bytes(s, dtype, target);
      const std::vector<char> stream = canonical(t, s, bytes);
      storage::BlockHasher h(storage::region_identity(t.key, dtype, t.shape, s), r.block_bytes, stream.size());
      h.update(stream.data(), stream.size());
      r.block_checksums = h.finish();
      t.regions.push_back(std::move(r));
    }
    ref.data.resize((ref.data.size() + 7) / 8 * 8, 0);
    info.tensors.push_back(std::move(t));
  };
  add("a/w", DType::kF32, {6, 5}, {ShardSpec::split({6, 5}, 0, 2, 0), ShardSpec::split({6, 5}, 0, 2, 1)}, 40);
  add("b/c", DType::kBF16, {4, 6}, {ShardSpec::split({4, 6}, 1, 2, 0), ShardSpec::split({4, 6}, 1, 2, 1)}, 12);
  add("c/z", DType::kF32, {4, 6},
      {ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 0, 10), ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 10, 24)}, 16);
  add("d/u", DType::kU8, {37}, {ShardSpec::whole({37})}, 8);
  auto e = v2::encode(info);
  if (!e.ok()) std::abort();
  ref.encoded = std::move(e).value();
  int64_t at = static_cast<int64_t>(ref.data.size());
  for (size_t i = 0; i < v2::kTableCount; ++i) {
    ref.offsets[i] = ref.encoded.tables[i].empty() ? -1 : at;
    at += static_cast<int64_t>(ref.encoded.tables[i].size());
  }
  ref.path = (access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm") : std::string("/tmp")) + "/h5ckpt-fuzz-index-" +
             std::to_string(getpid()) + ".h5";
  return ref;
}

const Reference& reference() {
  static const Reference ref = build();
  // The scratch file goes when the process exits normally (a crash leaves it beside the input).
  static const int cleanup = std::atexit([] { ::unlink(reference().path.c_str()); });
  (void)cleanup;
  return ref;
}

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* in, size_t size) {
  const Reference& ref = reference();
  if (size < 4) return 0;
  v2::Encoded enc = ref.encoded;
  for (size_t at = 4; at + 15 <= size; at += 15) {
    const uint8_t* ed = in + at;
    auto& table = enc.tables[ed[0] % v2::kTableCount];
    if (table.empty()) continue;
    const uint64_t rec_bytes = table.size() / std::max<uint64_t>(enc.records[ed[0] % v2::kTableCount], 1);
    const uint64_t records = table.size() / std::max<uint64_t>(rec_bytes, 1);
    const uint64_t pos =
        (le(ed + 1, 4) % std::max<uint64_t>(records, 1)) * rec_bytes + ed[5] % std::max<uint64_t>(rec_bytes, 1);
    const int width = 1 << (ed[6] & 3);
    const uint64_t value = le(ed + 7, 8);
    for (int b = 0; b < width && pos + b < table.size(); ++b) table[pos + b] = static_cast<char>(value >> (8 * b));
  }
  for (size_t i = 0; i < v2::kTableCount; ++i)
    enc.summary.tables[i].xxh3 = storage::checksum_bytes(enc.tables[i].data(), enc.tables[i].size());
  const std::string summary = enc.summary_json(ref.offsets);

  // The data file: the saved tensors with one byte flipped, then the (edited) tables.
  std::vector<char> file = ref.data;
  const uint64_t flip = le(in, 4) % ref.data.size();
  file[flip] = static_cast<char>(file[flip] ^ 0x5a);
  for (size_t i = 0; i < v2::kTableCount; ++i) {
    if (ref.offsets[i] < 0) continue;
    file.resize(static_cast<size_t>(ref.offsets[i]));
    file.insert(file.end(), enc.tables[i].begin(), enc.tables[i].end());
  }
  const int fd = ::open(ref.path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0 || ::write(fd, file.data(), file.size()) != static_cast<ssize_t>(file.size())) std::abort();
  ::close(fd);

  auto reader = storage::RegionReader::open(ref.path);
  if (!reader.ok()) std::abort();
  auto info = storage::read_metadata(summary, *reader);
  if (!info.ok()) return 0;
  for (const TensorInfo& t : info->tensors) {
    const TensorInfo* orig = ref.info.find(t.key);
    std::vector<char> got(t.nbytes, '\x7f');
    const Status st = reader->read_shard(t, ShardSpec::whole(t.shape), t.dtype, got.data());
    if (!st.ok()) continue;
    // Delivered without an error: it must be the tensor as saved, byte for byte.
    if (!orig || orig->dtype != t.dtype || orig->shape != t.shape ||
        std::memcmp(got.data(), ref.data.data() + orig->file_offset, t.nbytes) != 0) {
      std::fprintf(stderr, "verification hole: '%s' read OK with bytes that were not saved (flip at %llu)\n",
                   printable(t.key).c_str(), static_cast<unsigned long long>(flip));
      std::abort();
    }
  }
  return 0;
}
