// `h5ckpt diff A B`: tensor-by-tensor comparison of two checkpoints, whatever layouts saved
// them (both are read as global tensors, in bounded chunks of the row-major flattening).
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>

#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

using nlohmann::json;

struct DiffArgs {
  std::string a, b;
  double rtol = 0, atol = 0;
  bool json = false;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  int max_list = 20;
};

struct TensorDiff {
  std::string key;
  std::string problem;  ///< dtype/shape difference; empty when only values differ
  int64_t differing = 0;
  int64_t nan_mismatches = 0;  ///< one side NaN, the other not (not in max_abs_diff)
  double max_abs_diff = 0;
  int64_t first_index = -1;      ///< flat index of the first differing element
  bool values_compared = false;  ///< false when shapes (or non-float dtypes) differ
};

// Decodes n elements of dtype t into doubles (exact for every dtype but i64 beyond 2^53).
void to_double(const char* src, DType t, int64_t n, double* out) {
  switch (t) {
    case DType::kF64: std::memcpy(out, src, static_cast<size_t>(n) * 8); return;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      (void)convert_elements(src, t, out, DType::kF64, static_cast<size_t>(n));  // float to f64: cannot fail
      return;
    default: break;
  }
  for (int64_t i = 0; i < n; ++i) {
    const char* p = src + i * static_cast<int64_t>(dtype_size(t));
    switch (t) {
      case DType::kI8: {
        int8_t v;
        std::memcpy(&v, p, 1);
        out[i] = v;
        break;
      }
      case DType::kI16: {
        int16_t v;
        std::memcpy(&v, p, 2);
        out[i] = v;
        break;
      }
      case DType::kI32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        out[i] = v;
        break;
      }
      case DType::kI64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out[i] = static_cast<double>(v);
        break;
      }
      default: out[i] = static_cast<uint8_t>(*p); break;  // u8, bool
    }
  }
}

// Compares one tensor present in both checkpoints.
Status compare_tensor(const DiffArgs& args, CheckpointReader& ra, const TensorInfo& ta, CheckpointReader& rb,
                      const TensorInfo& tb, TensorDiff* d) {
  if (ta.shape != tb.shape) {
    d->problem = "shape " + shape_str(ta.shape) + " vs " + shape_str(tb.shape);
    return Status::Ok();
  }
  DType as_a = ta.dtype, as_b = tb.dtype;
  if (ta.dtype != tb.dtype) {
    d->problem = std::string("dtype ") + dtype_name(ta.dtype) + " vs " + dtype_name(tb.dtype);
    if (!dtype_is_float(ta.dtype) || !dtype_is_float(tb.dtype)) return Status::Ok();
    as_a = as_b = DType::kF64;  // still report how far apart the values are
  }
  d->values_compared = true;
  const bool exact = args.rtol == 0 && args.atol == 0 && ta.dtype == tb.dtype;
  const size_t es = dtype_size(as_a);
  const int64_t n = numel_of(ta.shape), per = chunk_elements(DType::kF64, args.chunk_bytes);
  std::vector<char> ba(static_cast<size_t>(std::min(n, per)) * es), bb(ba.size());
  std::vector<double> da(static_cast<size_t>(std::min(n, per))), db(da.size());
  for (int64_t begin = 0; begin < n; begin += per) {
    const int64_t cnt = std::min(per, n - begin);
    H5CKPT_RETURN_IF_ERROR(read_flat(ra, ta, begin, begin + cnt, as_a, ba.data()));
    H5CKPT_RETURN_IF_ERROR(read_flat(rb, tb, begin, begin + cnt, as_b, bb.data()));
    if (std::memcmp(ba.data(), bb.data(), static_cast<size_t>(cnt) * es) == 0) continue;  // fast path
    to_double(ba.data(), as_a, cnt, da.data());
    to_double(bb.data(), as_b, cnt, db.data());
    for (int64_t i = 0; i < cnt; ++i) {
      const double x = da[i], y = db[i];
      bool same;
      if (exact) same = std::memcmp(ba.data() + i * es, bb.data() + i * es, es) == 0;  // bit-exact
      else if (std::isnan(x) || std::isnan(y)) same = std::isnan(x) && std::isnan(y);
      else same = x == y || std::fabs(x - y) <= args.atol + args.rtol * std::fabs(y);
      if (same) continue;
      ++d->differing;
      if (d->first_index < 0) d->first_index = begin + i;
      if (std::isnan(x) != std::isnan(y)) ++d->nan_mismatches;
      else if (!std::isnan(x)) {
        const double diff = std::fabs(x - y);  // inf - inf of the same sign compared equal above
        if (diff > d->max_abs_diff || std::isnan(diff)) d->max_abs_diff = std::isnan(diff) ? INFINITY : diff;
      }
    }
  }
  return Status::Ok();
}

std::string fmt_double(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

int run_diff(const DiffArgs& args) {
  if (args.rtol < 0 || args.atol < 0) {
    std::cerr << "h5ckpt: diff: --rtol and --atol must be >= 0\n";
    return kExitError;
  }
  auto ra = CheckpointReader::open(args.a);
  if (!ra.ok()) return print_error("cannot read A '" + args.a + "'", ra.status()), kExitError;
  auto rb = CheckpointReader::open(args.b);
  if (!rb.ok()) return print_error("cannot read B '" + args.b + "'", rb.status()), kExitError;
  const CheckpointInfo* ia = &ra->info();
  const CheckpointInfo* ib = &rb->info();

  std::vector<std::string> only_a, only_b;
  std::vector<TensorDiff> diffs;
  size_t compared = 0;
  uint64_t compared_bytes = 0;
  for (const auto& ta : ia->tensors) {
    const TensorInfo* tb = ib->find(ta.key);
    if (!tb) {
      only_a.push_back(ta.key);
      continue;
    }
    TensorDiff d;
    d.key = ta.key;
    Status st = compare_tensor(args, *ra, ta, *rb, *tb, &d);
    if (!st.ok()) {
      print_error("diff: reading '" + ta.key + "'", st);
      return kExitError;
    }
    ++compared;
    compared_bytes += ta.nbytes;
    if (!d.problem.empty() || d.differing) diffs.push_back(std::move(d));
  }
  for (const auto& tb : ib->tensors)
    if (!ia->find(tb.key)) only_b.push_back(tb.key);
  const bool equal = only_a.empty() && only_b.empty() && diffs.empty();

  if (args.json) {
    json jd = json::array();
    for (const auto& d : diffs) {
      json j{{"key", d.key},
             {"values_compared", d.values_compared},
             {"differing_elements", d.differing},
             {"max_abs_diff", d.max_abs_diff},
             {"nan_mismatches", d.nan_mismatches}};
      j["problem"] = d.problem.empty() ? json(nullptr) : json(d.problem);
      j["first_differing_index"] = d.first_index >= 0 ? json(d.first_index) : json(nullptr);
      jd.push_back(std::move(j));
    }
    json out{{"equal", equal},
             {"a", ia->path},
             {"b", ib->path},
             {"rtol", args.rtol},
             {"atol", args.atol},
             {"compared_tensors", compared},
             {"compared_bytes", compared_bytes},
             {"only_in_a", only_a},
             {"only_in_b", only_b},
             {"differences", jd}};
    std::cout << dump_json(out) << "\n";
    return equal ? kExitOk : kExitFailed;
  }
  std::cout << "A: " << ia->path << " (tp=" << ia->saved_sizes.tp << " dp=" << ia->saved_sizes.dp
            << " pp=" << ia->saved_sizes.pp << ")\nB: " << ib->path << " (tp=" << ib->saved_sizes.tp
            << " dp=" << ib->saved_sizes.dp << " pp=" << ib->saved_sizes.pp << ")\n";
  auto list = [&](const char* title, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    std::cout << title << " (" << keys.size() << "):\n";
    for (size_t i = 0; i < keys.size(); ++i) {
      if (static_cast<int>(i) == args.max_list) {
        std::cout << "  ... and " << keys.size() - i << " more\n";
        break;
      }
      std::cout << "  " << keys[i] << "\n";
    }
  };
  list("only in A", only_a);
  list("only in B", only_b);
  if (!diffs.empty()) {
    std::cout << "different tensors (" << diffs.size() << "):\n";
    Table t({"key", "problem", "differing", "max abs diff", "first index"}, {false, false, true, true, true});
    for (const auto& d : diffs) {
      if (!d.values_compared) {
        t.add({d.key, d.problem, "-", "-", "-"});
        continue;
      }
      t.add({d.key, d.problem.empty() ? "values" : d.problem, std::to_string(d.differing),
             fmt_double(d.max_abs_diff) + (d.nan_mismatches ? " (+" + std::to_string(d.nan_mismatches) + " NaN)" : ""),
             d.first_index >= 0 ? std::to_string(d.first_index) : "-"});
    }
    t.print(std::cout);
  }
  std::cout << (equal ? "EQUAL" : "DIFFERENT") << ": " << compared << " common tensors (" << human_bytes(compared_bytes)
            << ") compared "
            << (args.rtol == 0 && args.atol == 0
                    ? std::string("bit-exact")
                    : "with rtol=" + fmt_double(args.rtol) + " atol=" + fmt_double(args.atol))
            << "\n";
  return equal ? kExitOk : kExitFailed;
}

}  // namespace

void register_diff(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DiffArgs>();
  CLI::App* sub = app.add_subcommand(
      "diff",
      "Compare two checkpoints tensor by tensor, whatever layouts saved them: keys only in A or B, dtype and "
      "shape differences, and per tensor the number of differing elements and the largest absolute difference. "
      "Bit-exact unless --rtol/--atol are given (then |a-b| <= atol + rtol*|b|, NaN equals NaN). "
      "Exit status 0 only when equal.");
  sub->add_option("A", args->a, "first checkpoint")->required();
  sub->add_option("B", args->b, "second checkpoint")->required();
  sub->add_option("--rtol", args->rtol, "relative tolerance (default 0)");
  sub->add_option("--atol", args->atol, "absolute tolerance (default 0)");
  sub->add_flag("--json", args->json, "machine-readable output");
  sub->add_option("--chunk-bytes", args->chunk_bytes,
                  "read tensors in chunks of at most this many bytes (default 64 MiB)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  sub->add_option("--max-list", args->max_list, "list at most this many keys per section (default 20)");
  sub->callback([args, exit_code] { *exit_code = run_on_rank0([&] { return run_diff(*args); }); });
}

}  // namespace h5ckpt::cli
