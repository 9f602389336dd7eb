// DeviceMesh: coordinates and per-dimension groups by splitting the world group.
#include "parallel/mesh/device_mesh.h"

#include <algorithm>
#include <numeric>

#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Row-major index of `coord` restricted to the dims where `take[d]`.
int64_t linear_index(const std::vector<int64_t>& coord, const std::vector<int64_t>& shape,
                     const std::vector<bool>& take) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (take[d]) index = index * shape[d] + coord[d];
  }
  return index;
}

}  // namespace

std::shared_ptr<DeviceMesh> DeviceMesh::create(std::shared_ptr<ProcessGroup> world,
                                               std::vector<int64_t> shape,
                                               std::vector<std::string> dim_names) {
  MT_CHECK(world != nullptr, "DeviceMesh: the world group is null");
  MT_CHECK(!shape.empty() && shape.size() == dim_names.size(),
           "DeviceMesh: expected one name per dimension and at least one dimension, got ",
           shape.size(), " sizes and ", dim_names.size(), " names (", join_names(dim_names), ")");
  int64_t total = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    MT_CHECK(shape[d] >= 1, "DeviceMesh: dimension '", dim_names[d], "' has size ", shape[d],
             "; sizes must be >= 1");
    MT_CHECK(!dim_names[d].empty(), "DeviceMesh: dimension ", d, " has an empty name");
    MT_CHECK(std::count(dim_names.begin(), dim_names.end(), dim_names[d]) == 1,
             "DeviceMesh: dimension name '", dim_names[d], "' is used twice");
    total *= shape[d];
  }
  auto mesh = std::shared_ptr<DeviceMesh>(new DeviceMesh());
  mesh->world_ = std::move(world);
  mesh->shape_ = std::move(shape);
  mesh->names_ = std::move(dim_names);
  MT_CHECK(total == mesh->world_->size(), "DeviceMesh: ", mesh->describe(), " holds ", total,
           " ranks but the world group ", mesh->world_->name(), " has ", mesh->world_->size());

  int64_t rest = mesh->world_->rank();
  mesh->coordinate_.assign(mesh->shape_.size(), 0);
  for (size_t d = mesh->shape_.size(); d-- > 0;) {
    mesh->coordinate_[d] = rest % mesh->shape_[d];
    rest /= mesh->shape_[d];
  }
  for (size_t d = 0; d < mesh->shape_.size(); ++d) {
    std::vector<bool> others(mesh->shape_.size(), true);
    others[d] = false;
    const int color = int(linear_index(mesh->coordinate_, mesh->shape_, others));
    mesh->groups_.push_back(mesh->world_->split(color, int(mesh->coordinate_[d])));
    mesh->groups_.back()->set_mesh_dim(mesh->names_[d]);
  }
  return mesh;
}

int64_t DeviceMesh::size() const {
  return std::accumulate(shape_.begin(), shape_.end(), int64_t(1), std::multiplies<>());
}

int64_t DeviceMesh::size(int64_t dim) const {
  MT_CHECK(dim >= 0 && dim < ndim(), describe(), ": no dimension ", dim);
  return shape_[size_t(dim)];
}

bool DeviceMesh::has_dim(const std::string& dim) const {
  return std::find(names_.begin(), names_.end(), dim) != names_.end();
}

int64_t DeviceMesh::dim_index(const std::string& dim) const {
  auto it = std::find(names_.begin(), names_.end(), dim);
  MT_CHECK(it != names_.end(), describe(), ": no dimension named '", dim, "'");
  return int64_t(it - names_.begin());
}

int64_t DeviceMesh::rank() const {
  return linear_index(coordinate_, shape_, std::vector<bool>(shape_.size(), true));
}

std::shared_ptr<DeviceMesh> DeviceMesh::submesh(const std::vector<std::string>& dims) {
  MT_CHECK(!dims.empty(), describe(), ": submesh needs at least one dimension");
  std::vector<bool> take(shape_.size(), false);
  int64_t last = -1;
  for (const auto& name : dims) {
    const int64_t d = dim_index(name);
    MT_CHECK(d > last, describe(), ": submesh dimensions must be distinct and in the mesh's order, "
             "got (", join_names(dims), ")");
    last = d;
    take[size_t(d)] = true;
  }
  std::vector<bool> others(take.size());
  for (size_t d = 0; d < take.size(); ++d) others[d] = !take[d];
  auto sub = std::shared_ptr<DeviceMesh>(new DeviceMesh());
  sub->world_ = world_->split(int(linear_index(coordinate_, shape_, others)),
                            int(linear_index(coordinate_, shape_, take)));
  sub->world_->set_mesh_dim(join_names(dims));
  for (size_t d = 0; d < take.size(); ++d) {
    if (!take[d]) continue;
    sub->shape_.push_back(shape_[d]);
    sub->names_.push_back(names_[d]);
    sub->coordinate_.push_back(coordinate_[d]);
    sub->groups_.push_back(groups_[d]);
  }
  return sub;
}

std::shared_ptr<DeviceMesh> DeviceMesh::flatten(const std::vector<std::string>& dims,
                                                const std::string& name) {
  MT_CHECK(!name.empty(), describe(), ": flatten needs a name for the new dimension");
  auto sub = submesh(dims);
  auto flat = std::shared_ptr<DeviceMesh>(new DeviceMesh());
  flat->world_ = sub->world_;
  flat->shape_ = {sub->size()};
  flat->names_ = {name};
  flat->coordinate_ = {sub->rank()};
  flat->groups_ = {sub->world_};
  sub->world_->set_mesh_dim(name);
  return flat;
}

std::string DeviceMesh::describe() const {
  std::string out = "DeviceMesh(";
  for (size_t d = 0; d < shape_.size(); ++d) {
    out += detail::concat(d ? ", " : "", d < names_.size() ? names_[d] : "?", "=",
                          shape_[d]);
  }
  return out + ")";
}

}  // namespace mt::parallel
