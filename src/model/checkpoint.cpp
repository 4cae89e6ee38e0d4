// Safetensors parsing and checkpoint directory resolution. See checkpoint.h for the file format.
#include "model/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The reference implementation (safetensors crate) refuses headers over 100 MB; so do we, which
// also stops a corrupt length from making us parse gigabytes of weights as JSON.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeInfo {
  const char* name;
  uint64_t size;
  std::optional<DType> dtype;
};

// Every dtype the safetensors format defines, so that a checkpoint carrying an unrelated F64 or
// BOOL tensor still validates; only the ones in DType can be bound to model weights.
constexpr DTypeInfo kDTypes[] = {
    {"F64", 8, std::nullopt},  {"F32", 4, DType::F32},          {"F16", 2, DType::F16},       {"BF16", 2, DType::BF16},
    {"I64", 8, DType::I64},    {"I32", 4, DType::I32},          {"I16", 2, std::nullopt},     {"I8", 1, std::nullopt},
    {"U64", 8, std::nullopt},  {"U32", 4, std::nullopt},        {"U16", 2, std::nullopt},     {"U8", 1, DType::U8},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, DType::FP8_E4M3}, {"F8_E5M2", 1, std::nullopt},
};

const DTypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

// numel * element size without wrapping: a forged shape like [2^40, 2^40] must not pass the
// "end - begin == bytes" check by overflow.
std::optional<uint64_t> checked_bytes(const std::vector<int64_t>& shape, uint64_t elem_size) {
  unsigned __int128 total = elem_size;
  for (int64_t d : shape) {
    total *= uint64_t(d);
    if (total > std::numeric_limits<uint64_t>::max()) return std::nullopt;
  }
  return uint64_t(total);
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->file_name_ = fs::path(path).filename().string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  f->size_ = uint64_t(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    fail("{}: file is {} bytes, too short for a safetensors header (truncated?)", f->file_name_, f->size_);
  }
  // MAP_PRIVATE + PROT_READ: pages come from the page cache on demand; nothing is copied until a
  // backend converts a tensor, and a writer replacing the file cannot corrupt our view in place.
  void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) fail("{}: mmap failed: {}", path, std::strerror(map_errno));
  f->map_ = map;
  ::madvise(map, f->size_, MADV_WILLNEED);
  f->parse_header();
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::parse_header() {
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  const std::string& fname = file_name_;
  if (header_len > size_ - 8)
    fail(
        "{}: header length {} is larger than the file ({} bytes after the length field; truncated "
        "or not a safetensors file)",
        fname, header_len, size_ - 8);
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the {} byte limit (not a safetensors file?)", fname, header_len,
         kMaxHeaderBytes);
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", fname, e.what());
  }
  if (!header.is_object()) fail("{}: header must be a JSON object", fname);

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size_ - data_start;
  const auto* data = bytes + data_start;
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ must be an object", fname);
      for (auto m = entry.begin(); m != entry.end(); ++m)
        metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      continue;
    }
    auto bad = [&](const std::string& why) -> void { fail("{}: tensor {}: {}", fname, name, why); };
    if (!entry.is_object()) bad("header entry is not an object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) bad("missing or non-string 'dtype'");
    if (sh == entry.end() || !sh->is_array()) bad("missing or non-list 'shape'");
    if (off == entry.end() || !off->is_array() || off->size() != 2) bad("'data_offsets' must be [begin, end]");
    SafetensorsTensor t;
    t.name = name;
    t.dtype_name = dt->get<std::string>();
    const DTypeInfo* info = find_dtype(t.dtype_name);
    if (!info) bad(fmt::format("unknown dtype '{}'", t.dtype_name));
    t.dtype = info->dtype;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) bad(fmt::format("shape {} has a negative or non-integer dimension", sh->dump()));
      uint64_t v = d.get<uint64_t>();
      if (v > uint64_t(std::numeric_limits<int64_t>::max())) bad(fmt::format("shape {} is too large", sh->dump()));
      t.shape.push_back(int64_t(v));
    }
    for (const auto& o : *off)
      if (!o.is_number_unsigned()) bad(fmt::format("data_offsets {} must be non-negative integers", off->dump()));
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end) bad(fmt::format("data_offsets [{}, {}]: begin is after end", begin, end));
    if (end > data_size)
      bad(
          fmt::format("data_offsets [{}, {}] out of range: the data section holds {} bytes "
                      "(file truncated?)",
                      begin, end, data_size));
    auto expected = checked_bytes(t.shape, info->size);
    if (!expected || *expected != end - begin)
      bad(fmt::format("data_offsets [{}, {}] span {} bytes but shape [{}] of {} needs {}", begin, end, end - begin,
                      fmt::join(t.shape, ", "), t.dtype_name,
                      expected ? fmt::format("{}", *expected) : std::string("more than 2^64")));
    t.data = data + begin;
    t.bytes = end - begin;
    auto [pos, inserted] = tensors_.emplace(name, std::move(t));
    ranges.push_back({begin, end, &pos->first});
  }
  // Tensors must not share bytes: overlapping ranges mean a corrupt or hostile header.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Range* furthest = nullptr;  // the non-empty range seen so far that ends last
  for (const Range& cur : ranges) {
    if (cur.end == cur.begin) continue;  // empty tensors occupy no bytes
    if (furthest && cur.begin < furthest->end)
      fail("{}: tensor {}: data_offsets [{}, {}] overlap tensor {} [{}, {}]", fname, *cur.name, cur.begin, cur.end,
           *furthest->name, furthest->begin, furthest->end);
    if (!furthest || cur.end > furthest->end) furthest = &cur;
  }
}

Checkpoint Checkpoint::open_dir(const std::string& dir) {
  Checkpoint ck;
  const fs::path root(dir);
  if (!fs::is_directory(root)) fail("{}: not a directory", dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name;

  if (fs::exists(index_path)) {
    const std::string index_name = index_path.filename().string();
    ck.description_ = index_name;
    json index;
    {
      std::ifstream in(index_path, std::ios::binary);
      if (!in) fail("{}: cannot open", index_path.string());
      try {
        index = json::parse(in);
      } catch (const json::exception& e) {
        fail("{}: invalid JSON: {}", index_name, e.what());
      }
    }
    auto wm = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || wm == index.end() || !wm->is_object()) fail("{}: no 'weight_map' object", index_name);
    std::map<std::string, std::string> tensor_to_file;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) fail("{}: tensor {}: file name must be a string", index_name, it.key());
      const std::string shard = it->get<std::string>();
      // Shards are siblings of the index; refuse paths that would escape the checkpoint directory.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..")
        fail("{}: tensor {}: invalid shard file name '{}'", index_name, it.key(), shard);
      tensor_to_file[it.key()] = shard;
    }
    for (const auto& [tensor, shard] : tensor_to_file) {
      if (by_name.count(shard)) continue;
      const fs::path shard_path = root / shard;
      if (!fs::exists(shard_path))
        fail("{}: shard {} (holding tensor {}) is listed in {} but missing", shard_path.string(), shard, tensor,
             index_name);
      by_name[shard] = SafetensorsFile::open(shard_path.string());
    }
    for (const auto& [tensor, shard] : tensor_to_file) ck.weight_map_[tensor] = by_name[shard].get();
  } else {
    std::vector<fs::path> paths;
    if (fs::exists(single_path)) {
      paths.push_back(single_path);
    } else {
      for (const auto& e : fs::directory_iterator(root))
        if (e.is_regular_file() && e.path().extension() == ".safetensors") paths.push_back(e.path());
      std::sort(paths.begin(), paths.end());
    }
    if (paths.empty()) fail("{}: no model.safetensors, model.safetensors.index.json or *.safetensors files", dir);
    ck.description_ = paths.size() == 1 ? paths[0].filename().string() : dir;
    for (const auto& p : paths) {
      auto f = SafetensorsFile::open(p.string());
      for (const auto& [name, t] : f->tensors()) {
        auto [it, inserted] = ck.weight_map_.emplace(name, f.get());
        if (!inserted) fail("{}: tensor {} is also in {}", f->file_name(), name, it->second->file_name());
      }
      by_name[p.filename().string()] = std::move(f);
    }
  }
  for (auto& [name, f] : by_name) ck.files_.push_back(f);
  return ck;
}

std::optional<Checkpoint::Found> Checkpoint::find(const std::string& name) const {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) return std::nullopt;
  const SafetensorsTensor* t = it->second->find(name);
  if (!t) fail("{}: tensor {}: listed in {} but not present in the file", it->second->file_name(), name, description_);
  return Found{t, it->second};
}

HostTensor host_view(const SafetensorsTensor& t) {
  HostTensor h;
  h.data = t.data;
  h.dtype = *t.dtype;
  h.shape = t.shape;
  h.name = t.name;
  return h;
}

}  // namespace ossrt
