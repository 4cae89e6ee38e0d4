#pragma once
// Safetensors files, memory-mapped and validated. A file is an 8-byte little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// data section that the offsets index. Everything the header claims is checked against the file
// size before any pointer is handed out, so a bad file is an ossrt::Error, never an out-of-bounds read.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/host_tensor.h"

namespace ossrt {

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;      // as written in the header ("BF16", "U8", "F64", ...)
  std::optional<DType> dtype;  // unset for safetensors dtypes ossrt has no use for (F64, I8, BOOL...)
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping
  uint64_t bytes = 0;
};

// The tensor as a HostTensor that still points into the file's mapping (its dtype must be set).
HostTensor host_view(const SafetensorsTensor& t);

class SafetensorsFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE) and parses the header. Throws naming the file (and tensor).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& file_name() const { return file_name_; }  // last path component, for messages
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  void parse_header();

  std::string path_, file_name_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All safetensors files of a checkpoint directory, resolved the way Hugging Face does:
// model.safetensors.index.json's weight_map if present, else model.safetensors, else every
// *.safetensors file in the directory (OpenAI's original/ layout).
class Checkpoint {
 public:
  static Checkpoint open_dir(const std::string& dir);

  struct Found {
    const SafetensorsTensor* tensor;
    const SafetensorsFile* file;
  };
  // nullopt when no file holds `name`. Throws when the index maps it to a file that lacks it.
  std::optional<Found> find(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name).has_value(); }
  // What to name in a "tensor not found" message: the index file, or the single weights file.
  const std::string& describe() const { return description_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> weight_map_;  // tensor name -> file that holds it
  std::string description_;
};

}  // namespace ossrt
