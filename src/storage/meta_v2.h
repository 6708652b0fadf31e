// Format version 2 of the global index (docs/format.md §4): packed little-endian tables stored as
// contiguous HDF5 datasets in the data file's /meta group, and `metadata.json` as a small signed
// summary that says where each table lies and what its xxh3 is. A reader preads the tables into
// one byte image and opens an Index over it in place: lookups need no JSON and no objects for the
// tensors a rank does not load. Records hold indices, never pointers, so an image can be shared
// between processes (MPI shared memory) and read at any address and alignment.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "storage/format.h"

namespace h5ckpt::storage::v2 {

/// The version this codec reads and writes.
inline constexpr int kFormatVersion = kFormatVersionV2;

/// The tables, in image order. Each is one dataset "/meta/<name>".
enum class Table : int { kTensors, kRegions, kExtents, kBlocks, kCoords, kNames, kAttributes, kSavedCoords };
inline constexpr size_t kTableCount = 8;
/// "tensors", "regions", ...
const char* table_name(Table t);
/// Bytes of one record of a table (1 for names, 8 for blocks and coords).
uint64_t record_bytes(Table t);

// ---- record layouts (all little-endian, no padding; docs/format.md §4.2) ----------------------

/// `tensors`: one per tensor, sorted by key (byte order).
struct TensorRecord {
  uint64_t key_offset;  ///< into `names`
  uint32_t key_length;
  uint8_t dtype;         ///< dtype code (§4.3)
  uint8_t ndim;          ///< 1..32
  uint16_t reserved;     ///< 0
  uint64_t shape_index;  ///< into `coords`: ndim extents
  uint64_t nbytes;
  int64_t file_offset;    ///< -1 when nbytes = 0
  uint64_t first_region;  ///< this tensor's regions are [first_region, first_region + region_count)
  uint64_t region_count;
  uint64_t first_block;  ///< its block checksums start here in `blocks`, region after region
};
static_assert(sizeof(TensorRecord) == 64);

/// `regions`: one per saved region, grouped by tensor in tensor order.
struct RegionRecord {
  uint32_t writer;  ///< saving world rank
  uint32_t extent;  ///< into `extents`: what part of the tensor, and its block size
};
static_assert(sizeof(RegionRecord) == 8);

/// `extents`: the distinct region geometries (shared by every region, of any tensor, with the
/// same box, flat range and block size: a model's layers repeat them).
struct ExtentRecord {
  uint64_t box_index;  ///< into `coords`: ndim offsets, then ndim extents
  int64_t flat_begin;  ///< with flat = 1: elements [flat_begin, flat_end) of the box's flattening
  int64_t flat_end;
  uint64_t block_bytes;  ///< verification block size; 0: the region has no block checksums
  uint32_t ndim;
  uint32_t flat;  ///< 0: the whole box; 1: a flat range of it
};
static_assert(sizeof(ExtentRecord) == 40);

/// `attributes`: the caller's string attributes, sorted by key (byte order), keys unique.
struct AttributeRecord {
  uint64_t key_offset;  ///< into `names`
  uint64_t value_offset;
  uint32_t key_length;
  uint32_t value_length;
};
static_assert(sizeof(AttributeRecord) == 24);

/// `saved_coords`: per saved world rank, its coordinates.
struct SavedCoordsRecord {
  int32_t tp, dp, pp;
};
static_assert(sizeof(SavedCoordsRecord) == 12);

/// The code stored for a dtype (fixed by the format, independent of the enum's values).
uint8_t dtype_code(DType t);
std::optional<DType> dtype_of_code(uint8_t code);

// ---- the summary (metadata.json) --------------------------------------------------------------

/// Where one table lies in the data file, as the summary records it.
struct TableRef {
  int64_t offset = -1;  ///< -1 for an empty table (no storage)
  uint64_t bytes = 0;
  uint64_t records = 0;
  uint64_t xxh3 = 0;  ///< of the table's bytes
};

struct Summary {
  int format_version = kFormatVersion;
  std::string library_version;
  int64_t step = -1;
  ParallelSizes saved_sizes;
  int64_t world = 0;
  bool checksums = false;  ///< every region has verification blocks
  std::array<TableRef, kTableCount> tables;

  const TableRef& table(Table t) const { return tables[static_cast<size_t>(t)]; }
  /// Where table `t` starts in the image: tables in order, each at a multiple of 8 bytes.
  uint64_t image_offset(Table t) const;
  /// Bytes of the image (all tables with their alignment gaps).
  uint64_t image_bytes() const;
};

/// Parses and checks the summary: self-checksum (index_xxh3), format name, version (a newer one is
/// kUnsupported), data_file, topology, every table reference (record size, bytes = records x
/// record size, offset -1 exactly when empty, xxh3) and the counts. Table bytes are not read here.
Result<Summary> parse_summary(const std::string& text);

// ---- writing ----------------------------------------------------------------------------------

/// The tables of a checkpoint's index, ready to be written as /meta datasets.
struct Encoded {
  std::array<std::vector<char>, kTableCount> tables;  ///< raw bytes of each table
  std::array<uint64_t, kTableCount> records{};
  Summary summary;  ///< everything but the table offsets (all -1)

  const std::vector<char>& bytes(Table t) const { return tables[static_cast<size_t>(t)]; }
  /// The tables as one image, laid out as Summary::image_offset says.
  std::vector<char> image() const;
  /// Total bytes of the tables (the index's size in the data file).
  uint64_t total_bytes() const;
  /// metadata.json for tables stored at `offsets` (index = Table; -1 for an empty table).
  std::string summary_json(const std::array<int64_t, kTableCount>& offsets) const;
};

/// The tensors encode reads, one at a time and in place: a CheckpointInfo's, or a save's plan with
/// its offsets and block sums (storage/checkpoint_commit.cpp), which a commit of 1.45 million
/// regions would otherwise copy into a CheckpointInfo first.
class TensorSource {
 public:
  struct Tensor {
    std::string_view key;
    DType dtype = DType::kF32;
    const Shape* shape = nullptr;
    uint64_t nbytes = 0;
    int64_t file_offset = -1;
    size_t regions = 0;
  };
  struct Region {
    const Box* box = nullptr;
    std::optional<std::pair<int64_t, int64_t>> flat;  ///< as ShardSpec::flat
    int64_t writer = -1;
    uint64_t whole_checksum = 0;  ///< format v1's, which format v2 refuses
    uint64_t block_bytes = 0;
    const uint64_t* sums = nullptr;
    size_t sum_count = 0;
  };
  virtual ~TensorSource() = default;
  virtual size_t size() const = 0;
  virtual Tensor tensor(size_t t) const = 0;
  virtual Region region(size_t t, size_t r) const = 0;
};

/// Encodes a checkpoint's metadata (paths ignored). Refuses what format v2 cannot hold: a
/// v1-style whole-region checksum (SavedRegion::checksum), a negative writer, block checksums
/// that do not match the region's block count.
Result<Encoded> encode(const CheckpointInfo& info);
/// The same with the tensors from `tensors` (`header.tensors` is not read).
Result<Encoded> encode(const CheckpointInfo& header, const TensorSource& tensors);

/// Bytes the tables of `info` take (what a save adds to the data file for its index).
Result<uint64_t> encoded_bytes(const CheckpointInfo& info);

// ---- reading ----------------------------------------------------------------------------------

/// A region as the index holds it.
struct RegionView {
  ShardSpec shard;
  int writer_rank = 0;
  uint64_t block_bytes = 0;
  uint64_t first_block = 0;  ///< index into the blocks table
  uint64_t block_count = 0;
};

/// The index over a caller-owned image (the concatenated tables). Nothing is copied: the image
/// must outlive the Index and stay unchanged. Accessors take tensor positions [0, tensor_count()).
class Index {
 public:
  /// Opens `image` (`size` bytes, any alignment) described by `summary`. Always checks what keeps
  /// every accessor inside the image: sizes, every index and range between tables, dtype codes,
  /// ndim, region geometry inside its tensor, block counts. With `validate` also everything a
  /// reader must check of untrusted bytes (docs/format.md §6): table checksums, keys valid and
  /// sorted, nbytes, tensors and tables inside a data file of `data_file_size` bytes and not
  /// overlapping, regions disjoint and covering, block sizes, writers, attributes sorted.
  /// Without `validate` the bytes must come from an image that passed it (e.g. on another rank).
  static Result<Index> open(const Summary& summary, const void* image, size_t size, uint64_t data_file_size,
                            bool validate);

  const Summary& summary() const { return summary_; }
  size_t tensor_count() const { return static_cast<size_t>(summary_.table(Table::kTensors).records); }
  /// Position of `key` (binary search), or nullopt.
  std::optional<size_t> find(std::string_view key) const;

  std::string_view key(size_t t) const;
  DType dtype(size_t t) const;
  Shape shape(size_t t) const;
  uint64_t nbytes(size_t t) const;
  int64_t file_offset(size_t t) const;
  size_t region_count(size_t t) const;
  /// The regions of tensor `t`, in stored order, with their block ranges.
  std::vector<RegionView> regions(size_t t) const;
  /// Block checksum `i` of the blocks table.
  uint64_t block_checksum(uint64_t i) const;

  /// The metadata as a CheckpointInfo: every tensor, or only those of `only_keys` that exist
  /// (unknown keys are left out). Paths are left empty.
  CheckpointInfo to_info(const std::vector<std::string>* only_keys = nullptr) const;

 private:
  Index() = default;
  TensorRecord tensor(size_t t) const;
  ExtentRecord extent(uint64_t e) const;
  int64_t coord(uint64_t i) const;
  const unsigned char* table_bytes(Table t) const;
  Status check_structure() const;
  Status check_contents(uint64_t data_file_size) const;
  // One region as the disjointness check sees it: its box, by position in the coords table (which
  // the encoder interns, so equal boxes share one), and its range of the box's elements.
  struct RegionRange {
    uint64_t box;
    int64_t begin, end;
    uint64_t region;  // within the tensor
  };
  struct RegionScratch {  // reused from one tensor to the next
    std::vector<RegionRange> ranges;
    std::vector<Box> boxes;
  };
  Status check_regions(size_t t, const Shape& shape, RegionScratch& scratch) const;
  TensorInfo materialize(size_t t) const;

  Summary summary_;
  std::array<const unsigned char*, kTableCount> tables_{};  ///< where each table starts in the image
};

/// Reads the tables `summary` names from the data file into one image (positioned reads; every
/// table must lie inside the file and no two may overlap, checked before anything is allocated).
Result<std::vector<char>> read_image(const Summary& summary, RegionReader& data);

}  // namespace h5ckpt::storage::v2
