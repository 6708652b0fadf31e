// h5ckpt.loader: the data-loader state of loader_state.h (exactly-once resharding over a DP change).
#include "common.h"

namespace h5ckpt_py {

using namespace h5ckpt;
using namespace h5ckpt::loader;

struct PyLoaderCheckpoint {
  LoaderCheckpoint lc;
  uint64_t generation = 0;
};

uint64_t loader_generation(const PyLoaderCheckpoint* lc) { return lc->generation; }

namespace {

py::bytes to_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

// Items a LoaderCheckpoint added to a StateDict point into its own buffers: hold the object.
void hold_new_items(PyStateDict& psd, size_t before, py::handle self, const PyLoaderCheckpoint& lc) {
  for (size_t i = before; i < psd.sd.size(); ++i) {
    auto h = std::make_shared<Hold>();
    h->owner = py::reinterpret_borrow<py::object>(self);
    h->loader = &lc;
    h->loader_generation = lc.generation;
    psd.holds.push_back(std::move(h));
    psd.writable.push_back(1);
  }
}

}  // namespace

void bind_loader(py::module_& m) {
  py::class_<SourceSpec>(m, "SourceSpec", "One data source: its share of samples and sample-length range (tokens).")
      .def(py::init([](std::string name, double ratio, int64_t min_len, int64_t max_len) {
             return SourceSpec{std::move(name), ratio, min_len, max_len};
           }),
           py::arg("name") = "", py::arg("ratio") = 1.0, py::arg("min_len") = 1, py::arg("max_len") = 1)
      .def_readwrite("name", &SourceSpec::name)
      .def_readwrite("ratio", &SourceSpec::ratio)
      .def_readwrite("min_len", &SourceSpec::min_len)
      .def_readwrite("max_len", &SourceSpec::max_len);
  py::class_<LoaderConfig>(m, "LoaderConfig", "What a loader is, independent of how many shards run it.")
      .def(py::init([](py::kwargs kw) { return with_kwargs(LoaderConfig{}, kw); }))
      .def_readwrite("seed", &LoaderConfig::seed)
      .def_readwrite("sources", &LoaderConfig::sources, "list of SourceSpec; assign a whole list")
      .def_readwrite("context_len", &LoaderConfig::context_len)
      .def_readwrite("workers_per_rank", &LoaderConfig::workers_per_rank)
      .def("validate", [](const LoaderConfig& c) { check(c.validate()); });
  py::class_<SampleId>(m, "SampleId")
      .def(py::init([](int32_t s, int64_t r) {
             return SampleId{s, r};
           }),
           py::arg("source") = 0, py::arg("record") = 0)
      .def_readwrite("source", &SampleId::source)
      .def_readwrite("record", &SampleId::record)
      .def("__eq__", [](const SampleId& a, const SampleId& b) { return a == b; })
      .def("__hash__", [](const SampleId& s) { return py::hash(py::make_tuple(s.source, s.record)); })
      .def("__repr__", [](const SampleId& s) {
        return "SampleId(" + std::to_string(s.source) + ", " + std::to_string(s.record) + ")";
      });
  py::class_<BufferedSample>(m, "BufferedSample")
      .def(py::init<>())
      .def_readwrite("id", &BufferedSample::id)
      .def_readwrite("offset", &BufferedSample::offset)
      .def_readwrite("length", &BufferedSample::length)
      .def("__eq__", [](const BufferedSample& a, const BufferedSample& b) { return a == b; });
  py::class_<Piece>(m, "Piece")
      .def(py::init<>())
      .def_readwrite("id", &Piece::id)
      .def_readwrite("begin", &Piece::begin)
      .def_readwrite("end", &Piece::end)
      .def("__eq__", [](const Piece& a, const Piece& b) { return a == b; });
  py::class_<ReplicatedState>(m, "ReplicatedState", "The replicated part of the loader state, saved once.")
      .def(py::init<>())
      .def_readwrite("config", &ReplicatedState::config)
      .def_readwrite("num_shards", &ReplicatedState::num_shards)
      .def_readwrite("base", &ReplicatedState::base)
      .def_readwrite("generation", &ReplicatedState::generation)
      .def("__eq__", [](const ReplicatedState& a, const ReplicatedState& b) { return a == b; });
  py::class_<ShardState>(m, "ShardState", "The sharded part of one shard (one read worker of one DP rank).")
      .def(py::init<>())
      .def_readwrite("shard", &ShardState::shard)
      .def_readwrite("next", &ShardState::next)
      .def_readwrite("draws", &ShardState::draws)
      .def_readwrite("pending", &ShardState::pending)
      .def_readwrite("buffer", &ShardState::buffer)
      .def_readwrite("tokens_consumed", &ShardState::tokens_consumed)
      .def_readwrite("samples_fetched", &ShardState::samples_fetched)
      .def("__eq__", [](const ShardState& a, const ShardState& b) { return a == b; });
  py::class_<Resharded>(m, "Resharded")
      .def_readonly("replicated", &Resharded::replicated)
      .def_readonly("shards", &Resharded::shards);
  py::class_<RankLoader>(m, "RankLoader", "A DP rank's loader: the replicated part and its workers' shards.")
      .def(py::init<>())
      .def_readwrite("replicated", &RankLoader::replicated)
      .def_readwrite("shards", &RankLoader::shards)
      .def_static("fresh", &RankLoader::fresh, py::arg("config"), py::arg("dp_size"), py::arg("dp_rank"));

  m.def("initial_replicated", &initial_replicated, py::arg("config"), py::arg("num_shards"));
  m.def("initial_shard", &initial_shard, py::arg("replicated"), py::arg("shard"));
  m.def(
      "reshard",
      [](const ReplicatedState& rep, const std::vector<ShardState>& old, int64_t n) {
        return unwrap(reshard(rep, old, n));
      },
      py::arg("replicated"), py::arg("old_shards"), py::arg("new_num_shards"),
      "Splits or merges all old shards into new_num_shards, keeping every sample exactly once.");
  m.def("serialize", [](const ReplicatedState& r) { return to_bytes(serialize(r)); });
  m.def("serialize", [](const ShardState& s) { return to_bytes(serialize(s)); });
  m.def("parse_replicated", [](py::bytes b) {
    std::string s = b;
    return unwrap(parse_replicated(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  });
  m.def("parse_shard", [](py::bytes b) {
    std::string s = b;
    return unwrap(parse_shard(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  });
  m.def("replicated_key", [] { return std::string(replicated_key()); });
  m.def("shard_key", &shard_key, py::arg("dp_rank"), py::arg("worker"));
  m.def(
      "parse_shard_key", [](const std::string& k) { return unwrap(parse_shard_key(k)); }, py::arg("key"));

  py::class_<PyLoaderCheckpoint>(
      m, "LoaderCheckpoint",
      "Owns the byte buffers a StateDict references while the loader is saved or loaded.\n"
      "save: stage_save(sd, loader, dp_rank), then Checkpointer.save. load: stage_load(sd, info),\n"
      "Checkpointer.load, finish_load(...). A stage_* call frees what the previous one staged\n"
      "(a StateDict still referencing it then fails its next save/load with a clear error).")
      .def(py::init<>())
      .def(
          "stage_save",
          [](py::object self, PyStateDict& sd, const RankLoader& loader, int dp_rank) {
            auto& lc = self.cast<PyLoaderCheckpoint&>();
            ++lc.generation;
            const size_t before = sd.sd.size();
            lc.lc.stage_save(sd.sd, loader, dp_rank);
            hold_new_items(sd, before, self, lc);
          },
          py::arg("state"), py::arg("loader"), py::arg("dp_rank"))
      .def(
          "stage_load",
          [](py::object self, PyStateDict& sd, const CheckpointInfo& info) {
            auto& lc = self.cast<PyLoaderCheckpoint&>();
            ++lc.generation;
            const size_t before = sd.sd.size();
            Status st = lc.lc.stage_load(sd.sd, info);
            hold_new_items(sd, before, self, lc);
            check(st);
          },
          py::arg("state"), py::arg("info"))
      .def(
          "finish_load",
          [](const PyLoaderCheckpoint& lc, int dp_size, int dp_rank, int workers) {
            return unwrap(lc.lc.finish_load(dp_size, dp_rank, workers));
          },
          py::arg("dp_size"), py::arg("dp_rank"), py::arg("workers_per_rank"))
      .def("saved_shards", [](const PyLoaderCheckpoint& lc) { return unwrap(lc.lc.saved_shards()); })
      .def("saved_replicated", [](const PyLoaderCheckpoint& lc) { return unwrap(lc.lc.saved_replicated()); });
}

}  // namespace h5ckpt_py
