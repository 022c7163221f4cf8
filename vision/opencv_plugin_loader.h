// Finds and loads the OpenCV plugin (vision/opencv_plugin) on first use, once per process.
#pragma once

#include "absl/status/statusor.h"
#include "vision/opencv_plugin/opencv_imdecode.h"

namespace iris::vision::detail {

// The plugin's imdecode. Looked for at the file named by $IRIS_OPENCV_PLUGIN when it is set (only
// there); otherwise in the build tree (where this binary was built), then beside the executable,
// then in ../lib/iris from it. UNIMPLEMENTED, naming every place tried and why each failed, when none
// loads (the answer is kept: later calls return it without looking again).
absl::StatusOr<opencv_plugin::ImdecodeFn> OpenCvImdecode();

}  // namespace iris::vision::detail
