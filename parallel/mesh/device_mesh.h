// DeviceMesh: the ranks of a job laid out as an N-D grid with named dimensions, and one process
// group per dimension (torch.distributed.DeviceMesh).
//
//   auto world = std::shared_ptr<ProcessGroup>(MpiProcessGroup::world());
//   auto mesh = DeviceMesh::create(world, {2, 2}, {"dp_replicate", "dp_shard"});
//   mesh->group("dp_shard")      // this rank's row: the ranks that differ only in dp_shard
//   mesh->submesh({"dp_shard"})  // a 1-D mesh over that dimension
//   mesh->flatten({"dp_replicate", "dp_shard"}, "dp")  // a 1-D mesh over both (here: the world)
//
// Conventions
// - World rank r sits at the row-major coordinate of r in `shape` (the last dim varies fastest),
//   as torch lays out init_device_mesh.
// - Creating a mesh, a sub-mesh or a flattened mesh is collective: every rank of the parent calls
//   it, in the same order (the groups are made by splitting the parent's world group). A
//   sub-mesh shares its dimensions' groups with its parent.
// - Names are unique within a mesh; dim sizes are >= 1 and multiply to the world size. Errors
//   name the mesh, its shape and the offending name or size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mt::parallel {

class DeviceMesh {
 public:
  static std::shared_ptr<DeviceMesh> create(std::shared_ptr<ProcessGroup> world,
                                            std::vector<int64_t> shape,
                                            std::vector<std::string> dim_names);

  int64_t ndim() const { return int64_t(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& dim_names() const { return names_; }
  int64_t size() const;               // ranks in this mesh
  int64_t size(int64_t dim) const;
  int64_t size(const std::string& dim) const { return size(dim_index(dim)); }
  int64_t dim_index(const std::string& dim) const;  // throws naming the mesh when absent
  bool has_dim(const std::string& dim) const;

  // This rank's index along `dim`, and its rank within the whole mesh (row-major).
  int64_t coordinate(int64_t dim) const { return coordinate_[size_t(dim)]; }
  int64_t coordinate(const std::string& dim) const { return coordinate(dim_index(dim)); }
  const std::vector<int64_t>& coordinates() const { return coordinate_; }
  int64_t rank() const;

  // The group of the ranks that share this rank's coordinates on every other dimension.
  ProcessGroup& group(int64_t dim) const { return *groups_[size_t(dim)]; }
  ProcessGroup& group(const std::string& dim) const { return group(dim_index(dim)); }
  std::shared_ptr<ProcessGroup> group_ptr(int64_t dim) const { return groups_[size_t(dim)]; }

  // The mesh over `dims` (a subset, in this mesh's order), through this rank (collective).
  std::shared_ptr<DeviceMesh> submesh(const std::vector<std::string>& dims);
  // A 1-D mesh named `name` whose one dimension runs over `dims` together (collective).
  std::shared_ptr<DeviceMesh> flatten(const std::vector<std::string>& dims, const std::string& name);

  // "DeviceMesh(dp_replicate=2, dp_shard=2)"
  std::string describe() const;

 private:
  DeviceMesh() = default;
  std::shared_ptr<ProcessGroup> world_;  // the parent world group every split starts from
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
  std::vector<int64_t> coordinate_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
};

}  // namespace mt::parallel
