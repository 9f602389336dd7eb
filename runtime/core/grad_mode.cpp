#include "runtime/core/grad_mode.h"

namespace mt::runtime {

namespace {
thread_local bool t_grad_enabled = true;
}

bool GradMode::enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

}  // namespace mt::runtime
